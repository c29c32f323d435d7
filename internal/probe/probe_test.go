package probe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/bpf"
	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/ksym"
	"github.com/dnsrace/dnsrace/internal/preemption"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// The running kernel's BTF is decoded once for every tracer the tests open.
func init() { sharedBTF = btf.NewCache() }

func requireBTF(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		testutil.SkipOrFail(t, "kernel has no BTF (/sys/kernel/btf/vmlinux)")
	}
}

func open(t *testing.T, opts Options) *Tracer {
	t.Helper()
	tr, err := Open(opts)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("Open: %-40v", ve)
		}
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	for _, p := range tr.Probes() {
		t.Logf("probe: %s", p)
	}
	return tr
}

func uniqueName(t *testing.T) string {
	return fmt.Sprintf("t%08x.dnsrace.test.", rand.Uint32())
}

func hasName(e *event.Event, qname string) bool {
	return bytes.Equal(e.DNS.NameBytes(), []byte(qname[:len(qname)-1]))
}

// wantTier is the tier a query's QUERY record comes from: the send hook
// in the fentry/kprobe tiers, a device in the tracepoint tier.
func wantTier(tr *Tracer, tier event.Tier) event.Tier {
	if tr.Mode() == ModeTracepoint {
		return event.TierTracepoint
	}
	return probeByHook(tr, "udp_sendmsg").Tier
}

// TestQueryAnswered: an answered query is one QUERY and one ANSWER record
// with the same query id, and nothing else (IPv4 and IPv6; from a
// connected socket, and from an unconnected one with no source address, as
// musl sends: the send hooks see none, so the answer's lookup must try the
// key without it). One tracer reads all four: an Open is seconds of
// verifier time under emulation, and the namespaces keep the cases apart.
func TestQueryAnswered(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	tier := testTier(t)
	tr := openTier(t, Options{Attach: tier})
	c := collect(t, tr)
	for _, tc := range []struct {
		name        string
		v6, connect bool
	}{{"ipv4", false, true}, {"ipv6", true, true}, {"ipv4-unconnected", false, false}, {"ipv6-unconnected", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTwoNS(t)
			server, network := serverAddr, "udp4"
			if tc.v6 {
				n.addIPv6(t)
				server, network = serverAddr6, "udp6"
			}
			n.serveDNS(t, server, dns.RcodeNameError, 1)
			qname := uniqueName(t)
			var conn *net.UDPConn
			var to *net.UDPAddr // unconnected: the destination of each send
			if tc.connect {
				conn = n.dial(t, network, server, 53)
			} else {
				conn, to = n.listen(t, network), &net.UDPAddr{IP: net.ParseIP(server), Port: 53}
			}
			if err := exchange(conn, to, dnsQuery(t, qname, dns.TypeA)); err != nil {
				t.Fatalf("no answer from the test server: %v", err)
			}
			q := c.query(t, qname)
			local := conn.LocalAddr().(*net.UDPAddr)
			if q.QID == 0 || q.NetNS != n.clientIno || q.DNS.QType != dns.TypeA || q.DNS.Response ||
				q.Packet.Dst.Addr().String() != server || q.Packet.Dst.Port() != 53 || q.Packet.Src.Port() != uint16(local.Port) ||
				q.Tier != wantTier(tr, tier) || q.Flags != event.FlagSender { // sent by this process: seen in its context
				t.Errorf("query: %s", describe(&q))
			}
			a, ok := c.wait(5*time.Second, func(e *event.Event) bool { return e.Kind == event.KindAnswer && e.QID == q.QID })
			if !ok {
				c.dump(t)
				t.Fatal("no ANSWER record")
			}
			if a.NetNS != n.clientIno || a.DNS.Rcode != dns.RcodeNameError || !a.Response() {
				t.Errorf("answer: %s rcode %d", describe(&a), a.DNS.Rcode)
			}
			time.Sleep(2 * IdleEvery) // anything else about it would be in by now
			if recs := c.of(q.QID); len(recs) != 2 {
				for _, e := range recs {
					t.Logf("  %s", describe(&e))
				}
				t.Errorf("%d records about the answered query, want 2", len(recs))
			}
			if lost := tr.Lost(); lost != 0 {
				t.Errorf("Lost() = %d", lost)
			}
			checkMissed(t, tr)
		})
	}
}

// checkMissed: the kernel's recursion misses are readable for every
// attached program (not asserted 0: an interrupt on a CPU that runs one of
// the programs may rightly skip another).
func checkMissed(t *testing.T, tr *Tracer) {
	t.Helper()
	missed, err := tr.Missed()
	if err != nil {
		t.Fatalf("Missed: %v", err)
	}
	for _, p := range tr.Probes() {
		if !p.Attached {
			continue
		}
		for _, name := range strings.Split(p.Program, "+") {
			n, ok := missed[name]
			if !ok {
				t.Errorf("Missed has no count for %s (hook %s): %v", name, p.Hook, missed)
			} else if n > 0 {
				t.Logf("%s: %d recursion misses", name, n)
			}
		}
	}
}

// TestDrop: a query the server's firewall drops is a QUERY and a DROP
// record with the netfilter reason (or, before drop reasons, nf_hook_slow
// as the freeing function) in the server's namespace; a non-DNS packet
// sends nothing.
func TestDrop(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	t.Run("detected", func(t *testing.T) { testDrop(t, "") })
	// Where the kernel preempts kernel code, kfree_skb is a perf
	// tracepoint (kfreeSkbVariant): load that program on any kernel.
	t.Run("preempting", func(t *testing.T) {
		saved := detectPreemption
		t.Cleanup(func() { detectPreemption = saved })
		detectPreemption = func() preemption.Model {
			return preemption.Model{Name: "full", Preempts: true, Basis: "the test"}
		}
		testDrop(t, bpf.DnsraceProgTpKfreeSkbPerf)
	})
}

// testDrop is TestDrop; wantProg, if set, is the kfree_skb program that
// must be attached.
func testDrop(t *testing.T, wantProg string) {
	n := newTwoNS(t)
	// nft: inet filter input: ct state new udp dport 53 drop
	nftRules(t, n.server, nftables.TableFamilyINet, nftables.ChainTypeFilter,
		nftables.ChainHookInput, nftables.ChainPriorityFilter,
		join(ctStateNew(), udpDport(53), []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}})...)
	tier := testTier(t)
	if wantProg != "" && tier == event.TierFentry {
		// A preempting kernel's hooks in a task refuse fentry: the
		// automatic choice gives them kprobes.
		tier = event.TierNone
	}
	tr := openTier(t, Options{Attach: tier})
	if wantProg != "" {
		var got []string
		for _, p := range tr.Probes() {
			if p.Hook == "kfree_skb" {
				got = append(got, p.Program)
				if p.Program != wantProg || !p.Attached {
					t.Errorf("kfree_skb: program %s attached=%v, want %s", p.Program, p.Attached, wantProg)
				}
			}
		}
		if len(got) == 0 {
			t.Error("no kfree_skb hook")
		}
	}
	c := collect(t, tr)
	n.sendUDP(t, serverAddr, 9999, []byte("not dns"))
	qname := uniqueName(t)
	n.sendUDP(t, serverAddr, 53, dnsQuery(t, qname, dns.TypeAAAA))

	q := c.query(t, qname)
	drop, ok := c.wait(5*time.Second, func(e *event.Event) bool { return e.Kind == event.KindDrop && e.QID == q.QID })
	if !ok {
		c.dump(t)
		t.Fatal("no DROP record for the query")
	}
	if drop.NetNS != n.serverIno || drop.Location == 0 || drop.Response() || drop.CT.Ptr == 0 || drop.CT.Confirmed() ||
		drop.CT.Orig != q.Packet {
		t.Errorf("drop: %s orig %s (query %s, server netns %d)", describe(&drop), drop.CT.Orig, q.Packet, n.serverIno)
	}
	if v, ok := DropReasonValue("NETFILTER_DROP"); ok {
		if drop.Reason != v {
			t.Errorf("drop reason %s, want NETFILTER_DROP", DropReasonName(drop.Reason))
		}
	} else if loc := locationName(t, drop.Location); loc != "nf_hook_slow" {
		t.Errorf("no drop reasons on this kernel and the drop was freed in %s, want nf_hook_slow", loc)
	}
	for _, e := range c.all() {
		if e.Packet.Src.Port() == 9999 || e.Packet.Dst.Port() == 9999 {
			t.Errorf("record for the non-DNS packet: %s", describe(&e))
		}
	}
	c.stop()
	if m := tr.Malformed(); m != 0 {
		t.Errorf("Malformed() = %d", m)
	}
}

// locationName is the function a drop location lies in.
func locationName(t *testing.T, addr uint64) string {
	syms, err := ksym.Load("")
	if err != nil {
		t.Fatal(err)
	}
	name, _, _ := syms.Lookup(addr)
	return name
}

// TestNATToAnotherPort: DNAT in the client's own OUTPUT hook sends the
// query for VIP:53 to a server on port 5353 (as OpenShift's DNS does). The
// query is still recognised (by its first sight, its conntrack entry's
// original tuple afterwards), and so is its answer.
func TestNATToAnotherPort(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	n := newTwoNS(t)
	nftRules(t, n.client, nftables.TableFamilyIPv4, nftables.ChainTypeNAT,
		nftables.ChainHookOutput, nftables.ChainPriorityNATDest,
		join(ipDaddr(vipAddr), udpDport(53), dnatToPort(serverAddr, 5353))...)
	n.serveDNSPort(t, serverAddr, 5353, dns.RcodeSuccess, 1)
	tier := testTier(t)
	tr := openTier(t, Options{Attach: tier})
	c := collect(t, tr)
	for i := range 3 {
		qname := uniqueName(t)
		if err := exchange(n.dial(t, "udp4", vipAddr, 53), nil, dnsQuery(t, qname, dns.TypeA)); err != nil {
			t.Fatalf("query %d: no answer through the DNAT: %v", i, err)
		}
		q := c.query(t, qname)
		if q.Packet.Dst.String() != vipAddr+":53" || q.NetNS != n.clientIno {
			t.Errorf("query %d: %s", i, describe(&q))
		}
		if _, ok := c.wait(5*time.Second, func(e *event.Event) bool { return e.Kind == event.KindAnswer && e.QID == q.QID }); !ok {
			c.dump(t)
			t.Fatalf("query %d: no ANSWER record", i)
		}
	}
}

// TestRcvbufFull: answers to a socket that does not read, with the
// smallest receive buffer, overflow it: udp_fail_queue_rcv_skb reports them
// in the client netns (before 6.10 without the packet: then the tuple comes
// from the socket). A first query's fifty answers fill the buffer; the
// answer of a second query is then dropped on its first arrival, the case
// that matters (a lookup's only answer lost at its socket).
func TestRcvbufFull(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	n := newTwoNS(t)
	n.serveDNS(t, serverAddr, dns.RcodeSuccess, 50)
	tr := openTier(t, Options{Attach: testTier(t)})
	p := probeByHook(tr, "udp_fail_queue_rcv_skb")
	if !p.Attached {
		t.Fatalf("udp_fail_queue_rcv_skb not attached: %s", p)
	}
	c := collect(t, tr)
	conn := n.dial(t, "udp4", serverAddr, 53)
	if err := conn.SetReadBuffer(1); err != nil {
		t.Fatal(err)
	}
	local := conn.LocalAddr().(*net.UDPAddr)
	ask := func(qname string) (event.Event, event.Event) {
		t.Helper()
		if _, err := conn.Write(dnsQuery(t, qname, dns.TypeA)); err != nil {
			t.Fatal(err)
		}
		q := c.query(t, qname)
		full, ok := c.wait(5*time.Second, func(e *event.Event) bool {
			// Without the packet (before 6.10) no record names a query.
			return e.Kind == event.KindRcvbufFull && e.NetNS == n.clientIno &&
				(e.QID == q.QID || hasName(e, qname) ||
					(e.QID == 0 && len(e.DNS.NameBytes()) == 0 && e.Packet.Dst.Port() == uint16(local.Port)))
		})
		if !ok {
			c.dump(t)
			t.Fatalf("no rcvbuf_full record for %s", qname)
		}
		if full.Packet.Src.String() != serverAddr+":53" {
			t.Errorf("rcvbuf_full: %s", describe(&full))
		}
		return q, full
	}
	ask(uniqueName(t)) // fills the buffer; its later copies may come unnamed
	if p.Program != "tp_udp_fail_queue_rcv_skb" {
		return // no packet before 6.10: the socket's tuple is all there is
	}
	// With the skb (6.10 on) an answer dropped on its first arrival names
	// its query in every tier, the tracepoint tier's included, which
	// matched it at the client's device moments before, on the same CPU.
	q, full := ask(uniqueName(t))
	if full.QID != q.QID {
		c.dump(t)
		t.Errorf("rcvbuf_full names query %d, want %d: %s", full.QID, q.QID, describe(&full))
	}
}

// TestLost fills a one-page ring buffer without reading it: the kernel
// side counts what it could not write, and reading works afterwards.
func TestLost(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	n := newTwoNS(t)
	tr := openTier(t, Options{Attach: testTier(t), RingBufferSize: uint32(os.Getpagesize())})
	const queries = 100 // a QUERY record each, about 130 bytes
	for range queries {
		n.sendUDP(t, serverAddr, 53, dnsQuery(t, uniqueName(t), dns.TypeA))
	}
	st := tr.Stats()
	if st.Lost == 0 || st.FlowsNew != queries {
		t.Errorf("stats %+v after %d queries into a %d-byte ring buffer", st, queries, os.Getpagesize())
	}
	c := collect(t, tr)
	if _, ok := c.wait(5*time.Second, func(e *event.Event) bool { return e.Kind == event.KindQuery }); !ok {
		t.Error("nothing read after the overflow")
	}
}

// TestClash races two datagrams of one fresh UDP flow from two CPUs
// through a DNAT rule in the client netns, batch after batch of racing
// pairs, until the kernel merges a loser into the winner (one backend: the
// entries match). The fentry/kprobe tiers see the merge at confirm's return
// (the winner named), the tracepoint tier the loser's freed unconfirmed
// entry. A chain of rules between the DNAT and confirm widens the window in
// which the second packet finds no confirmed entry, so clashes come within
// the bound under emulation too; no clash within it fails in CI (and skips
// elsewhere). Needs two CPUs.
// In the tracepoint tier the netfilter program (6.4+) sees the merge too:
// the loser's entry just before confirm, another one at its egress.
func TestClash(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	if runtime.NumCPU() < 2 {
		testutil.SkipOrFail(t, "the race needs two CPUs")
	}
	tier := testTier(t)
	n := newTwoNS(t)
	// DNAT in the client's own OUTPUT hook: both datagrams create and
	// confirm their entries in process context on their own CPU.
	nftRules(t, n.client, nftables.TableFamilyIPv4, nftables.ChainTypeNAT,
		nftables.ChainHookOutput, nftables.ChainPriorityNATDest,
		join(ipDaddr(vipAddr), udpDport(53), dnatTo(serverAddr))...)
	slowChain(t, n, 200)
	tr := openTier(t, Options{Attach: tier})
	c := collect(t, tr)
	nsPath := fmt.Sprintf("/proc/self/fd/%d", int(n.client))
	want := event.KindMerged
	if tr.Mode() == ModeTracepoint {
		if tr.HasNetfilter() {
			if err := tr.WatchNetNS(n.clientIno, nsPath); err != nil {
				t.Fatal(err)
			}
		} else {
			want = event.KindCTFreed
			if p := probeByHook(tr, "kmem_cache_free"); !p.Attached {
				testutil.SkipOrFail(t, "kmem_cache_free cannot be traced here: "+p.String())
			}
		}
	}
	msg := dnsQuery(t, uniqueName(t), dns.TypeA)
	isClash := func(e *event.Event) bool { return e.Kind == want && e.NetNS == n.clientIno }

	const (
		batch      = 500
		maxBatches = 40
		maxTime    = 2 * time.Minute
	)
	// The kernel's own count of resolved clashes in the client namespace
	// tells a race that did not happen from one the hook missed.
	before, err := ctstats.Read(nsPath)
	if err != nil {
		t.Fatalf("reading the client namespace's conntrack counters: %v", err)
	}
	start := time.Now()
	var clash event.Event
	ok := false
	pairs := 0
	for b := 0; b < maxBatches && time.Since(start) < maxTime && !ok; b++ {
		racePairs(t, n, msg, batch)
		pairs += batch
		clash, ok = c.wait(time.Second, isClash)
	}
	after, err := ctstats.Read(nsPath)
	if err != nil {
		t.Fatalf("reading the client namespace's conntrack counters: %v", err)
	}
	d := after.Total.Sub(before.Total)
	time.Sleep(2 * IdleEvery) // let the ring buffer drain
	events := uint64(0)
	for _, e := range c.all() {
		if isClash(&e) {
			events++
		}
	}
	t.Logf("%d racing pairs in %v: %d %s records; kernel counted clash_resolve %d, insert_failed %d",
		pairs, time.Since(start).Round(time.Millisecond), events, want, d.ClashResolve, d.InsertFailed)
	// One record per loser the kernel merged: every record is one the
	// kernel counted; the reverse can miss a few where a program does not
	// run nested in another on one CPU.
	if events > d.ClashResolve {
		t.Errorf("%d %s records but the kernel counted %d resolved clashes", events, want, d.ClashResolve)
	}
	// The netfilter program and the device hook see every packet of the
	// race, each by its own skb: exactly one record per merged loser.
	if tr.HasNetfilter() && events != d.ClashResolve {
		t.Errorf("%d %s records, the kernel counted %d resolved clashes: want one each", events, want, d.ClashResolve)
	}
	if !ok {
		if d.ClashResolve > 0 {
			t.Fatalf("the kernel resolved %d clashes but no %s record was read", d.ClashResolve, want)
		}
		testutil.SkipOrFail(t, fmt.Sprintf("no clash in %d racing pairs over %v (a starved machine?)", pairs, time.Since(start).Round(time.Second)))
		return
	}
	t.Logf("record: %s winner %#x %s status %#x", describe(&clash), clash.Winner.Ptr, clash.Winner.Orig, clash.Winner.Status)
	if clash.CT.Ptr == 0 || clash.CT.Confirmed() || clash.CT.Orig.Dst.String() != vipAddr+":53" {
		t.Errorf("loser entry: %#x %s status %#x", clash.CT.Ptr, clash.CT.Orig, clash.CT.Status)
	}
	wantTier := event.TierTracepoint
	if tr.Mode() == ModeFunction {
		// Confirm's exit reports the merge; the clash hook may be in
		// another tier (fentry where confirm's runs in a task take
		// kprobes).
		wantTier = probeByHook(tr, "nf_conntrack_confirm").Tier
	}
	if want == event.KindMerged && (clash.QID == 0 || clash.Tier != wantTier || clash.Winner.Ptr == 0 || clash.Winner.Ptr == clash.CT.Ptr ||
		!clash.Winner.Confirmed() || clash.Winner.Orig != clash.CT.Orig || clash.Flags&event.FlagWinner == 0) {
		t.Errorf("merge: loser %#x %s, winner %#x %s confirmed=%v, tier %s (want %s), qid %#x",
			clash.CT.Ptr, clash.CT.Orig, clash.Winner.Ptr, clash.Winner.Orig, clash.Winner.Confirmed(), clash.Tier, wantTier, clash.QID)
	}
}

// racePairs writes msg on each of pairs fresh connected sockets from two
// threads pinned to CPU 0 and CPU 1 at the same instant, one socket per
// round, and closes the sockets. The writes are plain write(2) calls on the
// socket's descriptor: net.UDPConn.Write holds a per-descriptor lock across
// the system call, which would let the second datagram leave only after the
// first was confirmed, and so never race.
func racePairs(t *testing.T, n *twoNS, msg []byte, pairs int) {
	t.Helper()
	fds := make([]int, 0, pairs)
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	vip := [4]byte(net.ParseIP(vipAddr).To4())
	err := inNS(n.client, func() error {
		for range pairs {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			fds = append(fds, fd)
			if err := unix.Connect(fd, &unix.SockaddrInet4{Port: 53, Addr: vip}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("opening sockets in the client netns: %v", err)
	}
	var round atomic.Int64
	var wg sync.WaitGroup
	for cpu := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				t.Errorf("pinning to CPU %d: %v", cpu, err)
			}
			for r := range pairs {
				for round.Load() < int64(r) { // spin: both start together
				}
				_, _ = unix.Write(fds[r], msg)
				if cpu == 0 {
					round.Add(1)
				}
			}
		}()
	}
	wg.Wait()
}

// slowChain adds a filter chain of n counting rules to the client's OUTPUT
// hook after DNAT: every packet walks it between creating its conntrack
// entry and confirming it, which keeps the entry unconfirmed longer.
func slowChain(t *testing.T, tn *twoNS, n int) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(tn.client)))
	if err != nil {
		t.Fatalf("nftables: %v", err)
	}
	tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "dnsrace_slow"})
	policy := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Name: "slow", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &policy})
	for i := range n {
		c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: join(udpDport(53), []expr.Any{&expr.Counter{}})})
		// Small batches: one batch of hundreds of rules overflows the
		// netlink socket with acks (ENOBUFS).
		if i%20 == 19 || i == n-1 {
			if err := c.Flush(); err != nil {
				t.Fatalf("installing the slow chain: %v", err)
			}
		}
	}
}

// TestFilters: Options.Ports and Options.NetNS are applied in the kernel.
func TestFilters(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	n := newTwoNS(t)
	tr := openTier(t, Options{Attach: testTier(t), Ports: []uint16{5353, 5300}, NetNS: n.clientIno})
	c := collect(t, tr)
	q53, q5353, q5300 := uniqueName(t), uniqueName(t), uniqueName(t)
	n.sendUDP(t, serverAddr, 53, dnsQuery(t, q53, dns.TypeA))
	n.sendUDP(t, serverAddr, 5353, dnsQuery(t, q5353, dns.TypeA))
	n.sendUDP(t, serverAddr, 5300, dnsQuery(t, q5300, dns.TypeA))
	c.query(t, q5353)
	c.query(t, q5300)
	for _, e := range c.all() {
		if hasName(&e, q53) {
			t.Errorf("record for port 53 with Ports 5353,5300: %s", describe(&e))
		}
		if e.NetNS != n.clientIno {
			t.Errorf("record outside the NetNS filter: %s", describe(&e))
		}
	}
	if _, err := Open(Options{Ports: make([]uint16, MaxPorts+1)}); err == nil {
		t.Errorf("Open with %d ports succeeded", MaxPorts+1)
	}
}

// TestReadAllocs: Read allocates a fixed amount per call, nothing per
// record (its batches are made by the first Read, here a warm-up that
// reads nothing).
func TestReadAllocs(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	n := newTwoNS(t)
	tr := openTier(t, Options{Attach: testTier(t)})
	warm, stop := context.WithCancel(t.Context())
	stop()
	if err := tr.Read(warm, func(*event.Event) {}, nil); err != nil {
		t.Fatal(err)
	}
	const queries = 200 // a QUERY record each (nothing answers)
	for range queries {
		n.sendUDP(t, serverAddr, 53, dnsQuery(t, uniqueName(t), dns.TypeA))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	seen := 0
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	err := tr.Read(ctx, func(e *event.Event) {
		if seen++; seen == queries {
			cancel()
		}
	}, nil)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if seen < queries {
		t.Fatalf("read %d records, want %d", seen, queries)
	}
	allocs := after.Mallocs - before.Mallocs
	t.Logf("%d records, %d allocations", seen, allocs)
	if allocs > 50 {
		t.Errorf("%d allocations for %d records", allocs, seen)
	}
}

// TestKernelBTFOption loads with an explicit BTF file, as --kernel-btf does.
func TestKernelBTFOption(t *testing.T) {
	tierIndependent(t)
	testutil.RequireRoot(t)
	requireBTF(t)
	tr := open(t, Options{Attach: event.TierTracepoint, KernelBTF: "/sys/kernel/btf/vmlinux"})
	if p := probeByHook(tr, "kfree_skb"); !p.Attached {
		t.Errorf("kfree_skb with --kernel-btf: %s", p)
	}
	if _, err := Open(Options{KernelBTF: "/nonexistent/btf"}); err == nil {
		t.Error("Open with a missing --kernel-btf file succeeded")
	} else {
		t.Logf("missing file: %v", err)
	}
}

// testTier is the tier the VM harness (cmd/vmtest) forces, default
// tracepoint.
func testTier(t *testing.T) event.Tier {
	s := os.Getenv("DNSRACE_TEST_TIER")
	if s == "" {
		return event.TierTracepoint
	}
	tier, err := event.ParseTier(s)
	if err != nil {
		t.Fatalf("DNSRACE_TEST_TIER: %v", err)
	}
	return tier
}

func probeByHook(tr *Tracer, hook string) ProbeInfo {
	for _, p := range tr.Probes() {
		if p.Hook == hook {
			return p
		}
	}
	return ProbeInfo{}
}

// TestForcedTier forces DNSRACE_TEST_TIER and checks what got attached:
// every function hook in that tier and only the tracepoints the function
// mode needs, or (tracepoint) every tracepoint and no function hook. In
// the function tiers a query through a DNAT rule is first seen at its send.
func TestForcedTier(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	tier := testTier(t)
	if tier == event.TierFentry && testutil.FentryLimit() != "" {
		// openTier checks the refusal and the kprobe fallback.
		forcedTierQuery(t, openTier(t, Options{Attach: tier}))
		return
	}
	tr := open(t, Options{Attach: tier})
	wantMode := ModeFunction
	if tier == event.TierTracepoint {
		wantMode = ModeTracepoint
	}
	if tr.Mode() != wantMode {
		t.Fatalf("mode %s with forced %s", tr.Mode(), tier)
	}
	for _, p := range tr.Probes() {
		fn := false
		for _, h := range functionHooks {
			fn = fn || h.name == p.Hook
		}
		switch {
		case fn && tier == event.TierTracepoint:
			if p.Attached || !errors.Is(p.Err, ErrNoTracepoint) {
				t.Errorf("%s with forced tracepoint tier: %s", p.Hook, p)
			}
		case fn:
			if !p.Attached || p.Tier != tier {
				t.Errorf("%s: want %s attached, got %s", p.Hook, tier, p)
			}
		case p.Hook == HookNetfilter && tier == event.TierTracepoint:
			// 6.4+: the netfilter program, else kmem_cache_free
			if p.Attached != (probeByHook(tr, "kmem_cache_free").Err == errNotNeededNF) || p.Attached && p.Tier != event.TierTracepoint {
				t.Errorf("netfilter %s, kmem_cache_free %s: want exactly one of them", p, probeByHook(tr, "kmem_cache_free"))
			}
		case p.Hook == "kmem_cache_free" || p.Hook == "udp_fail_queue_rcv_skb":
			// optional: depend on the kernel's tracepoint prototype
			if tier != event.TierTracepoint && p.Hook != "udp_fail_queue_rcv_skb" && (p.Attached || !errors.Is(p.Err, errNotNeeded)) {
				t.Errorf("%s in the %s tier: %s", p.Hook, tier, p)
			}
		case p.Hook == "kfree_skb" || tier == event.TierTracepoint:
			if !p.Attached || p.Tier != event.TierTracepoint {
				t.Errorf("%s: want tracepoint attached, got %s", p.Hook, p)
			}
		default:
			if p.Attached || !errors.Is(p.Err, errNotNeeded) {
				t.Errorf("%s: not needed in the %s tier, got %s", p.Hook, tier, p)
			}
		}
	}
	if tier == event.TierTracepoint {
		return
	}
	forcedTierQuery(t, tr)
}

// forcedTierQuery: a query through a DNAT rule is first seen at its send,
// in the tier the send hook attached with.
func forcedTierQuery(t *testing.T, tr *Tracer) {
	t.Helper()
	n := newTwoNS(t)
	nftRules(t, n.server, nftables.TableFamilyIPv4, nftables.ChainTypeNAT,
		nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest,
		join(ipDaddr(vipAddr), udpDport(53), dnatTo(serverAddr))...)
	c := collect(t, tr)
	qname := uniqueName(t)
	n.sendUDP(t, vipAddr, 53, dnsQuery(t, qname, dns.TypeA))
	q := c.query(t, qname)
	if q.Tier != probeByHook(tr, "udp_sendmsg").Tier || q.NetNS != n.clientIno || q.Packet.Dst.String() != vipAddr+":53" || q.DNS.QType != dns.TypeA ||
		q.PID != uint32(os.Getpid()) || q.Flags&event.FlagNoSocket != 0 {
		t.Errorf("query: %s pid %d", describe(&q), q.PID)
	}
	if lost := tr.Lost(); lost != 0 {
		t.Errorf("Lost() = %d", lost)
	}
}

// TestForcedTierRefused: forcing fentry or kprobe must attach the confirm
// hook in that tier where the kernel can give it, and fail Open with a
// TierError naming the hook where it cannot. Which one applies is asked of
// the kernel directly (a trivial program attached), not of the loader.
func TestForcedTierRefused(t *testing.T) {
	tierIndependent(t)
	testutil.RequireRoot(t)
	requireBTF(t)
	kprobe := testutil.KprobeLimit()
	if kprobe != "" && testutil.KprobeMultiLimit() == "" {
		kprobe = "" // kprobe.multi stands in
	}
	for _, c := range []struct {
		tier  event.Tier
		limit string
	}{{event.TierFentry, testutil.FentryLimit()}, {event.TierKprobe, kprobe}} {
		t.Run(c.tier.String(), func(t *testing.T) {
			tr, err := Open(Options{Attach: c.tier})
			if c.limit == "" {
				if err != nil {
					t.Fatalf("the kernel attaches %s programs, but forcing the tier failed: %v", c.tier, err)
				}
				defer tr.Close()
				if p := probeByHook(tr, "nf_conntrack_confirm"); !p.Attached || p.Tier != c.tier {
					t.Errorf("forced %s: confirm hook is %s", c.tier, p)
				}
				return
			}
			if err == nil {
				tr.Close()
				t.Fatalf("forced %s opened, though the kernel refuses it: %s", c.tier, c.limit)
			}
			var te *TierError
			if !errors.As(err, &te) {
				t.Fatalf("forced %s: error is not a TierError: %v", c.tier, err)
			}
			if te.Tier != c.tier || te.Hook == "" || te.Err == nil {
				t.Errorf("TierError %+v", te)
			}
			t.Logf("forced %s refused (%s): %v", c.tier, c.limit, err)
		})
	}
}

// TestKprobeMulti: Options.KprobeMulti attaches the kprobe tier through
// kprobe.multi links, which then trace a query; where the kernel has none
// (before 5.18, or no CONFIG_FPROBE, as on the CI host) the forced tier is
// refused saying so.
func TestKprobeMulti(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	if tier := os.Getenv("DNSRACE_TEST_TIER"); tier != "" && tier != "kprobe" {
		t.Skipf("a kprobe tier test: the VM matrix runs it with DNSRACE_TEST_TIER=kprobe, not %s", tier)
	}
	limit := testutil.KprobeMultiLimit()
	tr, err := Open(Options{Attach: event.TierKprobe, KprobeMulti: true})
	if limit != "" {
		if err == nil {
			tr.Close()
			t.Fatalf("kprobe.multi forced and opened, though the kernel refuses it: %s", limit)
		}
		var te *TierError
		if !errors.As(err, &te) || !strings.Contains(err.Error(), "kprobe.multi") {
			t.Fatalf("want a TierError naming kprobe.multi, got %v", err)
		}
		t.Logf("refused (%s): %v", limit, err)
		return
	}
	if err != nil {
		t.Fatalf("kprobe.multi attaches here, but the forced tier failed: %v", err)
	}
	defer tr.Close()
	for _, h := range []string{"nf_conntrack_confirm", "skb_consume_udp", "udp_sendmsg"} {
		if p := probeByHook(tr, h); !p.Attached || p.Tier != event.TierKprobe || !strings.HasSuffix(p.Program, "(kprobe.multi)") {
			t.Errorf("%s: %s, want attached through kprobe.multi", h, p)
		}
	}
	forcedTierQuery(t, tr)
}

// TestKprobeProgramsLoad runs the verifier on the kprobe programs, which
// load on every kernel with kprobe support compiled into BPF even where
// they cannot attach (as on the CI host).
func TestKprobeProgramsLoad(t *testing.T) {
	tierIndependent(t)
	testutil.RequireRoot(t)
	requireBTF(t)
	l, err := newLoader(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.t.Close()
	for _, h := range functionHooks {
		coll, err := l.load(func() []string {
			var p []string
			for _, ap := range h.kprobe {
				p = append(p, ap.prog)
			}
			return p
		}()...)
		if err != nil {
			var ve *ebpf.VerifierError
			if errors.As(err, &ve) {
				t.Errorf("%s: %-40v", h.name, ve)
			} else {
				t.Errorf("%s: %v", h.name, err)
			}
			continue
		}
		coll.Close()
	}
}

func TestTracepointVariants(t *testing.T) {
	tierIndependent(t)
	requireBTF(t)
	k, err := kernelSpec("", sharedBTF)
	if err != nil {
		t.Fatal(err)
	}
	l := &loader{kspec: k, t: &Tracer{}}
	for _, h := range tracepointHooks {
		prog, err := h.variant(l)
		t.Logf("%s -> %s %v", h.name, prog, err)
		if h.required && err != nil {
			t.Errorf("%s: %v", h.name, err)
		}
		if err == nil {
			if _, ok := mustSpec(t).Programs[prog]; !ok {
				t.Errorf("%s: program %s not in the object", h.name, prog)
			}
		}
	}
}

func mustSpec(t *testing.T) *ebpf.CollectionSpec {
	s, err := bpf.LoadDnsrace()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCloseIdempotent(t *testing.T) {
	tierIndependent(t)
	testutil.RequireRoot(t)
	requireBTF(t)
	tr, err := Open(Options{Attach: event.TierTracepoint, RingBufferSize: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Errorf("first Close: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := tr.Read(t.Context(), func(*event.Event) {}, nil); err != nil {
		t.Errorf("Read after Close: %v", err)
	}
}

// TestCloseWhileCounting: the counter readers (the progress line, /metrics
// and SIGUSR1 call them from their own goroutines) may run while Close
// does: they answer zero or nil after it and never use a released fd (run
// with -race to check the latter).
func TestCloseWhileCounting(t *testing.T) {
	tierIndependent(t)
	testutil.RequireRoot(t)
	requireBTF(t)
	tr, err := Open(Options{Attach: event.TierTracepoint, RingBufferSize: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var reads atomic.Int64
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				tr.Stats()
				tr.FlowsLive()
				if _, err := tr.Missed(); err != nil {
					t.Errorf("Missed while open or closing: %v", err)
					return
				}
				reads.Add(1)
			}
		}()
	}
	for reads.Load() < 100 {
		time.Sleep(time.Millisecond)
	}
	if err := tr.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	close(stop)
	wg.Wait()
	if s, m := tr.Stats(), tr.FlowsLive(); s != (Stats{}) || m != 0 {
		t.Errorf("after Close: Stats %+v, FlowsLive %d; want zero", s, m)
	}
	if m, err := tr.Missed(); m != nil || err != nil {
		t.Errorf("after Close: Missed %v, %v; want nil", m, err)
	}
}

func TestDropReasonName(t *testing.T) {
	tierIndependent(t)
	requireBTF(t)
	if !kernelHasType(t, "skb_drop_reason") {
		// Before 5.17 (e.g. 5.10) there is no enum skb_drop_reason: no name
		// resolves, and a drop has no reason to print.
		if v, ok := DropReasonValue("NOT_SPECIFIED"); ok {
			t.Errorf("NOT_SPECIFIED = %d on a kernel without enum skb_drop_reason", v)
		}
		if got := DropReasonName(0); got != "" {
			t.Errorf("DropReasonName(0) = %q without enum skb_drop_reason, want none", got)
		}
		return
	}
	v, ok := DropReasonValue("NOT_SPECIFIED")
	if !ok {
		t.Fatal("no NOT_SPECIFIED in enum skb_drop_reason")
	}
	if DropReasonName(v) != "NOT_SPECIFIED" {
		t.Errorf("round trip: %q", DropReasonName(v))
	}
	if got := DropReasonName(0xfffffff); got != "reason(268435455)" {
		t.Errorf("unknown value: %q", got)
	}
}

// TestAutoMode: with no tier forced, the function mode is used exactly when
// the confirm and delivery hooks attached; otherwise every function hook is
// left detached with its reason, and the device tracepoints trace.
func TestAutoMode(t *testing.T) {
	tierIndependent(t)
	testutil.RequireRoot(t)
	requireBTF(t)
	tr := open(t, Options{})
	confirm, consume, dev := probeByHook(tr, "nf_conntrack_confirm"), probeByHook(tr, "skb_consume_udp"), probeByHook(tr, "net_dev_queue")
	t.Logf("mode %s", tr.Mode())
	switch tr.Mode() {
	case ModeFunction:
		if !confirm.Attached || !consume.Attached || dev.Attached {
			t.Errorf("function mode: confirm %s, consume %s, net_dev_queue %s", confirm, consume, dev)
		}
	case ModeTracepoint:
		if confirm.Attached || consume.Attached || confirm.Err == nil || !dev.Attached {
			t.Errorf("tracepoint mode: confirm %s, consume %s, net_dev_queue %s", confirm, consume, dev)
		}
	}
}

// TestEmptyPrograms: with EmptyPrograms the same hooks attach as without,
// each with a two-instruction program that runs (the kernel's run counter
// rises while a query is answered) and sends nothing.
func TestEmptyPrograms(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	tier := testTier(t)
	full := openTier(t, Options{Attach: tier})
	want := map[string]string{}
	for _, p := range full.Probes() {
		if p.Attached {
			want[p.Hook] = p.Program
		}
	}
	full.Close()

	opts := Options{Attach: tier, EmptyPrograms: true}
	if tier == event.TierFentry && testutil.FentryLimit() != "" {
		opts.Attach = event.TierNone // openTier's fallback, as above
	}
	tr := open(t, opts)
	got := map[string]string{}
	for _, p := range tr.Probes() {
		if p.Attached {
			got[p.Hook] = p.Program
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("attached with empty programs: %v, want the same as without: %v", got, want)
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatalf("enabling BPF run-time statistics: %v", err)
	}
	defer stats.Close()

	n := newTwoNS(t)
	n.serveDNS(t, serverAddr, dns.RcodeNameError, 1)
	c := collect(t, tr)
	if err := exchange(n.dial(t, "udp4", serverAddr, 53), nil, dnsQuery(t, uniqueName(t), dns.TypeA)); err != nil {
		t.Fatalf("no answer from the test server: %v", err)
	}
	time.Sleep(2 * IdleEvery)
	c.stop()
	if recs := c.all(); len(recs) != 0 {
		t.Errorf("%d records from empty programs, want none; first: %s", len(recs), describe(&recs[0]))
	}
	runs := uint64(0)
	for _, coll := range tr.colls {
		for name, p := range coll.Programs {
			info, err := p.Info()
			if err != nil {
				t.Fatal(err)
			}
			ins, err := info.Instructions()
			if err != nil {
				t.Fatalf("%s: reading its instructions: %v", name, err)
			}
			if len(ins) != 2 {
				t.Errorf("%s: %d instructions, want 2 (r0 = 0; exit)", name, len(ins))
			}
			st, err := p.Stats()
			if err != nil {
				t.Fatal(err)
			}
			runs += st.RunCount
		}
	}
	if runs == 0 {
		t.Error("no empty program ran while a query was sent and answered")
	}
}
