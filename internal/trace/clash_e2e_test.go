package trace

import (
	"bytes"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/dnsserver"
	"github.com/dnsrace/dnsrace/internal/lab"
	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/probe"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// clashThreads is how many threads write the same query on one socket at
// once: DNSRACE_TEST_CLASH_THREADS, default 4: two a CPU here. The kernel's own
// conntrack_clash.sh selftest (udpclash) runs 128; on two CPUs those take
// turns, and a burst of 128 spinning threads takes longer for the same
// races.
func clashThreads(t *testing.T) int {
	return testutil.EnvInt(t, "DNSRACE_TEST_CLASH_THREADS", 4, 2)
}

// TestTraceClashThreads is the kernel selftest conntrack_clash.sh in the
// lab: many threads write the same query on one socket at the same instant,
// through the node's DNAT to three backends at random (merged losers, and
// reply-only inserts of losers sent elsewhere), and on the dns namespace's
// loopback to a local server, conntrack on and no NAT (merged losers,
// where no NAT rule made dnsrace watch the namespace from the start).
// Every race the kernel rescued is explained, whatever the thread count:
// the reconciliation of each namespace is exact.
func TestTraceClashThreads(t *testing.T) {
	testutil.RequireRoot(t)
	if runtime.NumCPU() < 2 {
		testutil.SkipOrFail(t, "the race needs two CPUs")
	}
	topo := lab.Topology{Prefix: labPrefix + "c", Pods: 1, Backends: 3}
	_ = lab.Teardown(topo.Prefix)
	l, err := lab.Up(topo, lab.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Down()
	// The dns namespace: a server on its loopback; conntrack comes on
	// there (a filter rule that reads it, no NAT) after the node's
	// bursts, whose copies would otherwise race again at its LOCAL_IN,
	// the README's known gap.
	local := netip.MustParseAddrPort("127.0.0.1:53")
	var srv *dnsserver.Server
	if err := nsutil.Do(topo.DNSNS(), func() (err error) {
		srv, err = dnsserver.Start(dnsserver.Config{Addr: local})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	var out bytes.Buffer
	s, err := Start(Options{Probe: probe.Options{Attach: tier(t)}, Out: &out, JSON: true})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			s.Stop()
		}
	}()
	// Two thread counts: a few, which races most on two CPUs, and the
	// selftest's 128, a burst of which takes turns on them.
	vip := netip.AddrPortFrom(lab.VIP, 53)
	nodeRescued := clashUntil(t, topo.NodeNS(), topo.PodNS(0), vip, clashThreads(t), clashRaces)
	nodeRescued += clashUntil(t, topo.NodeNS(), topo.PodNS(0), vip, 128, 1)
	conntrackOn(t, topo.DNSNS())
	dnsRescued := clashUntil(t, topo.DNSNS(), topo.DNSNS(), local, clashThreads(t), clashRaces)
	dnsRescued += clashUntil(t, topo.DNSNS(), topo.DNSNS(), local, 128, 1)
	time.Sleep(time.Second) // the answers, and the records of the last races
	sum := s.Stop()
	stopped = true

	byPath := map[string]NamespaceSummary{}
	for _, n := range sum.Namespaces {
		byPath[n.Path] = n
	}
	for _, c := range []struct {
		ns      string
		rescued uint64
	}{{topo.NodeNS(), nodeRescued}, {topo.DNSNS(), dnsRescued}} {
		n, ok := byPath[nsutil.Path(c.ns)]
		if !ok {
			t.Errorf("%s: no reconciliation; namespaces %+v", c.ns, sum.Namespaces)
			continue
		}
		t.Logf("%s: kernel clash_resolve %d (the bursts' own count %d), explained %d (%d counted before it was watched), insert_failed %d/%d, watched %v",
			c.ns, n.Kernel.ClashResolve, c.rescued, n.Attributed.ClashResolve, n.ClashBeforeWatched, n.Kernel.InsertFailed, n.Attributed.InsertFailed, n.Watched)
		if n.Kernel.ClashResolve < c.rescued || c.rescued < clashRaces {
			t.Errorf("%s: the tracer read clash_resolve %d, the bursts alone raised it by %d", c.ns, n.Kernel.ClashResolve, c.rescued)
		}
		if n.Kernel.ClashResolve != n.Attributed.ClashResolve || n.Kernel.InsertFailed != n.Attributed.InsertFailed {
			t.Errorf("%s: kernel clash_resolve/insert_failed %d/%d, explained %d/%d", c.ns,
				n.Kernel.ClashResolve, n.Kernel.InsertFailed, n.Attributed.ClashResolve, n.Attributed.InsertFailed)
		}
	}
	if sum.EventsLost != 0 || len(sum.Mismatch) != 0 {
		t.Errorf("events lost %d, mismatch %v", sum.EventsLost, sum.Mismatch)
	}
}

// clashRaces is how many rescued races each namespace must see: many
// losers, not one.
const clashRaces = 20

// clashUntil sends bursts from netns from (threads threads, one socket,
// one query) to dst until natNS's clash_resolve rose by races, at most 500
// bursts; it returns that rise.
func clashUntil(t *testing.T, natNS, from string, dst netip.AddrPort, threads int, races uint64) uint64 {
	t.Helper()
	before, err := ctstats.Read(nsutil.Path(natNS))
	if err != nil {
		t.Fatal(err)
	}
	w := newClashWorkers(threads)
	defer w.stop()
	var rescued uint64
	t0, burst := time.Now(), 0
	defer func() {
		t.Logf("%s: %d races rescued in %d bursts of %d threads, %v", natNS, rescued, burst, len(w.bursts), time.Since(t0).Round(time.Millisecond))
	}()
	for ; burst < 500 && rescued < races; burst++ {
		w.burst(t, from, dst, uint16(burst))
		after, err := ctstats.Read(nsutil.Path(natNS))
		if err != nil {
			t.Fatal(err)
		}
		rescued = after.Total.Sub(before.Total).ClashResolve
	}
	if rescued < races {
		t.Fatalf("%d races rescued in %s after 500 bursts of %d threads, want %d", rescued, natNS, len(w.bursts), races)
	}
	return rescued
}

// clashWorkers are threads, each locked and pinned to a CPU
// in turn, that write one message on one socket together when a burst's
// start flag is set. They live across bursts: making the threads anew
// would cost each burst more than its races.
type clashWorkers struct {
	bursts []chan clashJob
	wg     sync.WaitGroup
}

type clashJob struct {
	fd          int
	msg         []byte
	start       *atomic.Bool
	ready, done *sync.WaitGroup
}

func newClashWorkers(n int) *clashWorkers {
	w := &clashWorkers{}
	for i := range n {
		jobs := make(chan clashJob)
		w.bursts = append(w.bursts, jobs)
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(i % runtime.NumCPU())
			_ = unix.SchedSetaffinity(0, &set)
			for j := range jobs {
				j.ready.Done()
				for !j.start.Load() { // spin: all write at once
				}
				// a plain write(2): net.UDPConn would serialize the writers
				_, _ = unix.Write(j.fd, j.msg)
				j.done.Done()
			}
		}()
	}
	return w
}

func (w *clashWorkers) stop() {
	for _, jobs := range w.bursts {
		close(jobs)
	}
	w.wg.Wait()
}

// burst writes one query from every worker at once on one new socket
// connected to dst in netns from, and closes it after a moment for the
// answers.
func (w *clashWorkers) burst(t *testing.T, from string, dst netip.AddrPort, id uint16) {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(lab.QName(0), dns.TypeA)
	q.Id = id
	msg, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	if err := nsutil.Do(from, func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		return unix.Connect(fd, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()})
	}); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var ready, done sync.WaitGroup
	var start atomic.Bool
	ready.Add(len(w.bursts))
	done.Add(len(w.bursts))
	for _, jobs := range w.bursts {
		jobs <- clashJob{fd: fd, msg: msg, start: &start, ready: &ready, done: &done}
	}
	ready.Wait()
	start.Store(true)
	done.Wait()
	time.Sleep(20 * time.Millisecond) // the answers
}

// conntrackOn adds a filter table that reads every output packet's
// conntrack state, as the selftest's "ct state new counter" does: the
// namespace's conntrack runs, with no NAT rule.
func conntrackOn(t *testing.T, ns string) {
	t.Helper()
	f, err := os.Open(nsutil.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "dnsrace_ct"})
	policy := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Name: "out", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &policy})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{8, 0, 0, 0}, Xor: []byte{0, 0, 0, 0}}, // new
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
		&expr.Counter{},
	}})
	if err := c.Flush(); err != nil {
		t.Fatalf("conntrack rule in %s: %v", ns, err)
	}
}
