package correlate

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/miekg/dns"

	"github.com/dnsrace/dnsrace/internal/event"
)

// These tests hold a stall to the lookup it began with when other pods ask
// with the same DNS ids at the same time: the lab's musl emulation draws
// ids from its lookup count (2n for A, 2n+1 for AAAA), so pods that start
// together ask with the same ids, for the same name or their own. A retry
// or a sibling goes on only with a stall of its own namespace and name
// (and socket, or process where the resolver reopens its socket).

// asker is a resolver in a namespace: a pod's, or one of two processes in
// one pod.
type asker struct {
	ns   uint32
	addr netip.Addr
	pid  uint32
	name string
}

// ask sends a QUERY record of a's, from port, and returns its qid.
func (h *harness) ask(t uint64, a asker, port, id, qtype uint16) uint64 {
	h.qid++
	e := &event.Event{Kind: event.KindQuery, Flags: event.FlagSender, QID: h.qid, TimeNs: t, NetNS: a.ns, CPU: uint16(h.qid % 2),
		Packet: event.Tuple{Src: netip.AddrPortFrom(a.addr, port), Dst: vip, Proto: 17}, Tier: event.TierTracepoint, PID: a.pid}
	copy(e.Comm[:], "resolver")
	e.DNS.Valid, e.DNS.ID, e.DNS.QType = true, id, qtype
	e.DNS.SetQName(a.name)
	h.c.Handle(e)
	h.checkStalls()
	return h.qid
}

// checkStalls holds the name states and the stalls in progress to each
// other: every stall is the one of its name's state in the table, and no
// recycled state still refers to one. A state freed while a caller held
// it, and then given a stall, carried that stall to whatever name reused
// it next: another pod's lost queries and retries joined it.
func (h *harness) checkStalls() {
	h.t.Helper()
	c := h.c
	for _, o := range c.stalls.s {
		if s, ok := c.ix.names.get(uint64(o.key)); !ok || s.stall != o {
			h.t.Fatalf("stall of %s in netns %d (first lost %s/%d) is not its name's (its name has a state: %v)",
				o.inc.QName, o.inc.NetNS, o.inc.Lost[0].QType, o.inc.Lost[0].ID, ok)
		}
		first := o.queries[0]
		for _, q := range o.queries[1:] {
			if q.netns != first.netns || q.name != first.name {
				h.t.Fatalf("stall of %s in netns %d holds a query of %s in netns %d", first.qname, first.netns, q.qname, q.netns)
			}
		}
	}
	for _, sl := range c.ix.names.slots {
		if sl.k != 0 && sl.v.stall != nil && (!c.stalls.has(sl.v.stall) || uint64(sl.v.stall.key) != sl.k) {
			h.t.Fatalf("name state %x refers to a stall not in progress, or another name's", sl.k)
		}
	}
	for _, s := range c.ix.freeNames {
		if s.stall != nil || s.pend.head != nil {
			h.t.Fatalf("a recycled name state still refers to a stall (%v) or to queries", s.stall != nil)
		}
	}
}

func (h *harness) tick(now uint64) {
	h.c.Tick(now)
	h.checkStalls()
}

// The lab's local-out-snat scenario, by hand: pods a and b start together
// and ask with the same ids; each loses one query of its first lookup,
// which its resend on the same socket 2.5 s later gets answered, then a
// query of its next lookup (on a new socket, the next ids), resent and
// answered 2.5 s later. Pod c asks with the next lookup's ids too, but
// later. One incident per stalled lookup, each of one pod: its namespace,
// its name, its own resend as the retry.
func TestPodsWithTheSameIDsStayApart(t *testing.T) {
	for _, names := range []string{"same name", "own names"} {
		t.Run(names, func(t *testing.T) {
			pods := []asker{
				{podA, netip.MustParseAddr("10.244.0.10"), 1000, "svc-00.lab.test"},
				{podB, netip.MustParseAddr("10.244.0.13"), 1003, "svc-03.lab.test"},
				{podB + 1, netip.MustParseAddr("10.244.0.11"), 1001, "svc-01.lab.test"},
			}
			if names == "same name" {
				for i := range pods {
					pods[i].name = "svc.lab.test"
				}
			}
			a, b, c := pods[0], pods[1], pods[2]
			h := newHarness(t, nil)
			const resend = 2500 * ms
			lose := func(at uint64, p asker, port, id, qtype uint16) {
				h.handle(drop(at+10_000, h.ask(at, p, port, id, qtype), reasonNetfilter, 1, event.CT{}))
				h.checkStalls()
			}
			get := func(at uint64, p asker, port, id, qtype uint16) { h.answer(at+ms, h.ask(at, p, port, id, qtype)) }

			// First lookups: a loses A/10, b AAAA/11.
			lose(0, a, 40000, 10, dns.TypeA)
			get(20_000, a, 40000, 11, dns.TypeAAAA)
			get(30_000, b, 40000, 10, dns.TypeA)
			lose(40_000, b, 40000, 11, dns.TypeAAAA)
			h.tick(400 * ms)
			get(resend, a, 40000, 10, dns.TypeA)
			get(resend+20_000, b, 40000, 11, dns.TypeAAAA)
			// Next lookups, ids 12/13, on new sockets at once: both lose A.
			next := resend + 5*ms
			lose(next, a, 40001, 12, dns.TypeA)
			get(next+20_000, a, 40001, 13, dns.TypeAAAA)
			lose(next+30_000, b, 40001, 12, dns.TypeA)
			get(next+40_000, b, 40001, 13, dns.TypeAAAA)
			for now := next + 100*ms; now < 4*sec; now += 100 * ms {
				h.tick(now)
			}
			// c, later, with the same ids.
			lose(4*sec, c, 40001, 12, dns.TypeA)
			get(4*sec+20_000, c, 40001, 13, dns.TypeAAAA)
			h.tick(4*sec + 400*ms)
			get(next+resend, a, 40001, 12, dns.TypeA)
			get(next+resend+30_000, b, 40001, 12, dns.TypeA)
			h.tick(next + resend + 500*ms)
			get(4*sec+resend, c, 40001, 12, dns.TypeA)
			for now := 7 * sec; now < 30*sec; now += sec {
				h.tick(now)
			}
			h.c.Close(30 * sec)
			h.checkStalls()

			type want struct {
				p      asker
				lost   string
				retry  netip.AddrPort
				stallS float64
			}
			wants := []want{
				{a, "A/10", netip.AddrPortFrom(a.addr, 40000), 2.5},
				{b, "AAAA/11", netip.AddrPortFrom(b.addr, 40000), 2.5 - 0.00002},
				{a, "A/12", netip.AddrPortFrom(a.addr, 40001), 2.5},
				{b, "A/12", netip.AddrPortFrom(b.addr, 40001), 2.5},
				{c, "A/12", netip.AddrPortFrom(c.addr, 40001), 2.5},
			}
			if len(h.incidents) != len(wants) {
				for _, inc := range h.incidents {
					t.Logf("netns %d %s lost %v retry %+v stall %.3f ms", inc.NetNS, inc.QName, lostIDs(inc), inc.Retry, stallMs(inc))
				}
				t.Fatalf("%d incidents, want %d: one per stalled lookup", len(h.incidents), len(wants))
			}
			for i, w := range wants {
				inc := h.incidents[i]
				got := lostIDs(inc)
				if inc.NetNS != w.p.ns || inc.QName != w.p.name || inc.PID != w.p.pid || inc.Src.Addr() != w.p.addr ||
					len(got) != 1 || got[0] != w.lost+" rule_drop" {
					t.Errorf("incident %d: netns %d %s pid %d from %v, lost %v; want netns %d %s pid %d from %v, lost %s",
						i, inc.NetNS, inc.QName, inc.PID, inc.Src, got, w.p.ns, w.p.name, w.p.pid, w.p.addr, w.lost)
				}
				if ms := stallMs(inc); inc.Retry == nil || inc.Retry.Src != w.retry || ms < w.stallS*1000-1 || ms > w.stallS*1000+1 {
					t.Errorf("incident %d (netns %d): retry %+v, stall %.3f ms; want its resend from %v, %.0f ms",
						i, inc.NetNS, inc.Retry, ms, w.retry, w.stallS*1000)
				}
			}
		})
	}
}

// Two processes of one pod ask the same name with the same ids on their
// own sockets, a second apart, and lose a query each: the second
// process's query resends nothing of the first's (another socket, another
// process), so neither's lost query joins the other's stall.
func TestOneNamespaceTwoProcessesSameIDs(t *testing.T) {
	h := newHarness(t, nil)
	addr := netip.MustParseAddr("10.244.0.10")
	p1 := asker{podA, addr, 1000, "svc.lab.test"}
	p2 := asker{podA, addr, 2000, "svc.lab.test"}
	q1 := h.ask(0, p1, 40000, 10, dns.TypeA)
	h.handle(drop(10_000, q1, reasonNetfilter, 1, event.CT{}))
	h.tick(400 * ms)
	q2 := h.ask(sec, p2, 50000, 10, dns.TypeA)
	h.handle(drop(sec+10_000, q2, reasonNetfilter, 1, event.CT{}))
	h.tick(sec + 400*ms)
	h.answer(2500*ms+ms, h.ask(2500*ms, p1, 40000, 10, dns.TypeA))
	h.tick(3 * sec)
	h.answer(3500*ms+ms, h.ask(3500*ms, p2, 50000, 10, dns.TypeA))
	h.tick(4 * sec)
	h.c.Close(20 * sec)
	if len(h.incidents) != 2 {
		t.Fatalf("%d incidents, want 2 (one per process's lookup): %+v", len(h.incidents), h.incidents)
	}
	for i, p := range []asker{p1, p2} {
		if inc := h.incidents[i]; inc.PID != p.pid || len(inc.Lost) != 1 {
			t.Errorf("incident %d: pid %d, lost %v; want pid %d's one lost query", i, inc.PID, lostIDs(inc), p.pid)
		}
	}
}

// A resolver's lookups, simulated: how it resends, and how long it waits.
type resolverSim struct {
	name string
	// every: the time between attempts; attempts: how many.
	every    uint64
	attempts int
	// all: an attempt resends both queries (glibc), not only the
	// unanswered ones (musl).
	all bool
}

// simLookup is one simulated lookup and what it lost.
type simLookup struct {
	pod, n int
	lost   int // queries lost (sends)
}

// Pods running a resolver with ids from their lookup count, for the same
// name or their own, from the same or their own addresses (containers on
// separate bridges may all be 10.0.0.2), each lookup on a new socket, losing
// queries at random by drop or by silence, interleaved in time: exactly
// one incident per lookup that lost a query, of that lookup's pod and
// holding that lookup's lost queries.
func TestPodsWithTheSameIDsOneIncidentPerStalledLookup(t *testing.T) {
	resolvers := []resolverSim{
		{"musl", 2500 * ms, 2, false},
		{"glibc", 5 * sec, 2, true},
	}
	for _, rs := range resolvers {
		for _, sameName := range []bool{true, false} {
			for _, sameAddr := range []bool{true, false} {
				name := fmt.Sprintf("%s/same name %v/same address %v", rs.name, sameName, sameAddr)
				t.Run(name, func(t *testing.T) {
					for seed := range uint64(8) {
						simulatePods(t, rs, sameName, sameAddr, seed)
					}
				})
			}
		}
	}
}

func simulatePods(t *testing.T, rs resolverSim, sameName, sameAddr bool, seed uint64) {
	const (
		nPods   = 4
		horizon = 60 * sec
	)
	h := newHarness(t, nil)
	pods := make([]asker, nPods)
	for i := range pods {
		pods[i] = asker{ns: uint32(4026532000 + i), addr: netip.AddrFrom4([4]byte{10, 244, 0, byte(10 + i)}),
			pid: uint32(3000 + i), name: fmt.Sprintf("svc-%02d.lab.test", i)}
		if sameName {
			pods[i].name = "svc.lab.test"
		}
		if sameAddr {
			pods[i].addr = netip.MustParseAddr("10.0.0.2")
		}
	}
	type step struct {
		at  uint64
		pod int
		do  func()
	}
	var steps []step
	var lookups []*simLookup
	for p := range pods {
		r := rand.New(rand.NewPCG(seed, uint64(p)))
		at := uint64(r.IntN(50_000))
		for n := 1; at < horizon; n++ {
			l := &simLookup{pod: p, n: n}
			lookups = append(lookups, l)
			port, ids := uint16(30000+n), [2]uint16{uint16(2 * n), uint16(2*n + 1)}
			types := [2]uint16{dns.TypeA, dns.TypeAAAA}
			want := [2]bool{true, true}
			start, end := at, at+uint64(rs.attempts)*rs.every
			for a := 0; a < rs.attempts && (want[0] || want[1]); a++ {
				send := start + uint64(a)*rs.every
				done := uint64(0)
				for i := range 2 {
					if !want[i] && !rs.all {
						continue
					}
					send += uint64(r.IntN(30_000))
					qid := new(uint64)
					pa, id, qt, sent := pods[p], ids[i], types[i], send
					steps = append(steps, step{sent, p, func() { *qid = h.ask(sent, pa, port, id, qt) }})
					switch k := r.IntN(10); {
					case k < 7 || !want[i]: // answered (a resent answered query too)
						ans := sent + uint64(200_000+r.IntN(2_000_000))
						steps = append(steps, step{ans, p, func() { h.answer(ans, *qid) }})
						want[i], done = false, max(done, ans)
					case k < 9: // dropped in the node
						steps = append(steps, step{sent + 10_000, p, func() {
							h.handle(drop(sent+10_000, *qid, reasonNetfilter, 1, event.CT{}))
						}})
						l.lost++
					default: // never answered, no drop seen
						l.lost++
					}
				}
				if !want[0] && !want[1] {
					end = done
				}
			}
			at = end + uint64(1_000_000+r.IntN(5_000_000))
		}
	}
	slices.SortStableFunc(steps, func(x, y step) int { return cmp.Compare(x.at, y.at) })
	const tickEvery = 50 * ms
	next := tickEvery
	for _, s := range steps {
		for ; next <= s.at; next += tickEvery {
			h.tick(next)
		}
		s.do()
	}
	for ; next <= horizon+30*sec; next += tickEvery {
		h.tick(next)
	}
	h.c.Close(next)
	h.checkStalls()

	// Every stalled lookup: one incident, its pod's, with its lost
	// queries.
	stalled := map[[2]int]*simLookup{}
	for _, l := range lookups {
		if l.lost > 0 {
			stalled[[2]int{l.pod, l.n}] = l
		}
	}
	seen := map[[2]int]int{}
	for _, inc := range h.incidents {
		p := slices.IndexFunc(pods, func(a asker) bool { return a.ns == inc.NetNS })
		if p < 0 {
			t.Fatalf("seed %d: incident in netns %d, no pod's", seed, inc.NetNS)
		}
		pod := pods[p]
		n := int(inc.Lost[0].ID / 2)
		if inc.QName != pod.name || inc.PID != pod.pid || inc.Src != netip.AddrPortFrom(pod.addr, uint16(30000+n)) {
			t.Errorf("seed %d: incident of netns %d: %s pid %d from %v; want pod %d's %s pid %d, lookup %d's socket",
				seed, inc.NetNS, inc.QName, inc.PID, inc.Src, p, pod.name, pod.pid, n)
		}
		for _, l := range inc.Lost {
			if int(l.ID/2) != n {
				t.Errorf("seed %d: incident of pod %d lookup %d holds lost %v: another lookup's", seed, p, n, lostIDs(inc))
				break
			}
		}
		if r := inc.Retry; r != nil && r.Src.Addr() != pod.addr {
			t.Errorf("seed %d: incident of pod %d lookup %d: retry from %v, not the pod", seed, p, n, r.Src)
		}
		k := [2]int{p, n}
		seen[k]++
		if l := stalled[k]; l == nil {
			t.Errorf("seed %d: incident of pod %d lookup %d, which lost nothing: lost %v", seed, p, n, lostIDs(inc))
		} else if len(inc.Lost) != l.lost {
			t.Errorf("seed %d: pod %d lookup %d lost %d queries, its incident holds %v", seed, p, n, l.lost, lostIDs(inc))
		}
	}
	for k := range stalled {
		if seen[k] != 1 {
			t.Errorf("seed %d: pod %d lookup %d stalled: %d incidents, want 1", seed, k[0], k[1], seen[k])
		}
	}
	if len(h.incidents) != len(stalled) {
		t.Errorf("seed %d: %d incidents, %d stalled lookups", seed, len(h.incidents), len(stalled))
	}
}
