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
// once, as the kernel's own conntrack_clash.sh selftest does (udpclash).
const clashThreads = 128

// TestTraceClashThreads is the kernel selftest conntrack_clash.sh in the
// lab: 128 threads write the same query on one socket at the same instant,
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
	// The dns namespace: conntrack on (a filter rule that reads it), no
	// NAT, and a server on its loopback.
	conntrackOn(t, topo.DNSNS())
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
	vip := netip.AddrPortFrom(lab.VIP, 53)
	nodeRescued := clashUntil(t, topo.NodeNS(), topo.PodNS(0), vip)
	dnsRescued := clashUntil(t, topo.DNSNS(), topo.DNSNS(), local)
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
		if n.Kernel.ClashResolve < c.rescued {
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

// clashUntil sends bursts from netns from (clashThreads threads, one
// socket, one query) to dst until natNS's clash_resolve rose, at most 20
// bursts; it returns that rise.
func clashUntil(t *testing.T, natNS, from string, dst netip.AddrPort) uint64 {
	t.Helper()
	before, err := ctstats.Read(nsutil.Path(natNS))
	if err != nil {
		t.Fatal(err)
	}
	for burst := 0; burst < 20; burst++ {
		clashBurst(t, from, dst, uint16(burst))
		after, err := ctstats.Read(nsutil.Path(natNS))
		if err != nil {
			t.Fatal(err)
		}
		if d := after.Total.Sub(before.Total); d.ClashResolve > 0 {
			time.Sleep(200 * time.Millisecond) // the answers come back
			after, _ = ctstats.Read(nsutil.Path(natNS))
			return after.Total.Sub(before.Total).ClashResolve
		}
	}
	t.Fatalf("no race rescued in %s after 20 bursts of %d threads", natNS, clashThreads)
	return 0
}

// clashBurst writes one query from clashThreads threads at once on one new
// socket connected to dst in netns from, and closes it after a moment for
// the answers.
func clashBurst(t *testing.T, from string, dst netip.AddrPort, id uint16) {
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
	var ready, wg sync.WaitGroup
	var start atomic.Bool
	ready.Add(clashThreads)
	for i := range clashThreads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(i % runtime.NumCPU())
			_ = unix.SchedSetaffinity(0, &set)
			ready.Done()
			for !start.Load() { // spin: all write at once
			}
			// a plain write(2): net.UDPConn would serialize the writers
			_, _ = unix.Write(fd, msg)
		}()
	}
	ready.Wait()
	start.Store(true)
	wg.Wait()
	time.Sleep(50 * time.Millisecond)
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
