package correlate

import (
	"net/netip"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/event"
)

const (
	podA, podB, node = 100, 101, 200
	reasonNetfilter  = 1
	reasonNoSocket   = 2
	ms               = uint64(time.Millisecond)
)

var (
	vip    = netip.MustParseAddrPort("10.96.0.10:53")
	srcA   = netip.MustParseAddrPort("10.244.0.10:6000")
	srcB   = netip.MustParseAddrPort("10.244.0.11:5000")
	snated = event.Tuple{Src: netip.MustParseAddrPort("10.96.100.11:53"), Dst: netip.MustParseAddrPort("10.96.100.1:10001"), Proto: 17}
)

type fakeCounters map[uint32]ctstats.Counters

func (f fakeCounters) Delta(ns uint32) (ctstats.Counters, bool) { c, ok := f[ns]; return c, ok }

type harness struct {
	c         *Correlator
	incidents []*Incident
}

func newHarness(counters fakeCounters) *harness {
	h := &harness{}
	h.c = New(Config{
		Counters: counters,
		ReasonName: func(v uint32) string {
			return map[uint32]string{reasonNetfilter: "NETFILTER_DROP", reasonNoSocket: "NO_SOCKET"}[v]
		},
		OnIncident: func(inc *Incident) { h.incidents = append(h.incidents, inc) },
	})
	return h
}

func dnsEv(kind event.Kind, t uint64, ns uint32, skb uint64, src, dst netip.AddrPort, id, qtype uint16) *event.Event {
	e := &event.Event{Kind: kind, TimeNs: t, NetNS: ns, Skb: skb, Packet: event.Tuple{Src: src, Dst: dst, Proto: 17}}
	e.DNS.Valid, e.DNS.ID, e.DNS.QType = true, id, qtype
	e.DNS.SetQName("svc-00.lab.test")
	return e
}

func answer(t uint64, ns uint32, q *event.Event) *event.Event {
	e := dnsEv(event.KindRecv, t, ns, 999, q.Packet.Dst, q.Packet.Src, q.DNS.ID, q.DNS.QType)
	e.DNS.Response = true
	return e
}

func withCT(e *event.Event, ptr uint64, status uint32, orig, reply event.Tuple) *event.Event {
	e.CT = event.CT{Ptr: ptr, Status: status, Orig: orig, Reply: reply}
	return e
}

func TestReplyClashStall(t *testing.T) {
	h := newHarness(fakeCounters{node: {InsertFailed: 1, Drop: 1}})
	t0 := uint64(1e9)
	// Pod B's query wins: confirmed with the SNAT reply tuple.
	w := dnsEv(event.KindXmit, t0, podB, 1, srcB, vip, 1, 1)
	h.c.Handle(w)
	h.c.Handle(withCT(dnsEv(event.KindXmit, t0+10_000, node, 1, srcB, vip, 1, 1), 0xA, event.IPSConfirmed,
		event.Tuple{Src: srcB, Dst: vip, Proto: 17}, snated))
	// Pod A's A query got the same reply tuple and is dropped at confirm.
	a := dnsEv(event.KindXmit, t0+20_000, podA, 2, srcA, vip, 2, 1)
	h.c.Handle(a)
	drop := withCT(dnsEv(event.KindDrop, t0+30_000, node, 2, srcA, vip, 2, 1), 0xB, 0,
		event.Tuple{Src: srcA, Dst: vip, Proto: 17}, snated)
	drop.Reason = reasonNetfilter
	h.c.Handle(drop)
	// Its AAAA sibling went through and was answered.
	aaaa := dnsEv(event.KindXmit, t0+25_000, podA, 3, srcA, vip, 3, 28)
	h.c.Handle(aaaa)
	h.c.Handle(answer(t0+2*ms, podA, aaaa))
	h.c.Tick(t0 + 500*ms)
	if len(h.incidents) != 0 {
		t.Fatalf("incident before the retry: %+v", h.incidents[0])
	}
	// glibc retries 5 s later on the same socket with the same id.
	h.c.Handle(dnsEv(event.KindXmit, t0+20_000+5000*ms, podA, 4, srcA, vip, 2, 1))
	if len(h.incidents) != 1 {
		t.Fatalf("%d incidents, want 1", len(h.incidents))
	}
	inc := h.incidents[0]
	if inc.Cause != CauseInsertRace || inc.Race == nil || *inc.Race != RaceReplyClash {
		t.Fatalf("cause %s race %v", inc.Cause, inc.Race)
	}
	if inc.StallMs == nil || *inc.StallMs != 5000 || !inc.Retried {
		t.Fatalf("stall %v retried %v", inc.StallMs, inc.Retried)
	}
	if inc.Winner == nil || inc.Winner.Src != srcB.String() || inc.Winner.NetNS != podB {
		t.Fatalf("winner %+v", inc.Winner)
	}
	if inc.Sibling == nil || inc.Sibling.QType != "AAAA" || !inc.Sibling.Answered {
		t.Fatalf("sibling %+v", inc.Sibling)
	}
	if inc.QType != "A" || inc.NetNS != podA || inc.QName != "svc-00.lab.test" || inc.Src != srcA.String() {
		t.Fatalf("incident %+v", inc)
	}
	if a := h.c.Attributed()[node]; a.InsertFailed != 1 || a.Drop != 1 {
		t.Fatalf("attributed %+v", a)
	}
}

// A netfilter drop of an unconfirmed entry with no winner seen and no
// insert_failed in the kernel's counters is a firewall rule.
func TestRuleDropWithoutBudget(t *testing.T) {
	h := newHarness(fakeCounters{node: {}})
	a := dnsEv(event.KindXmit, 1e9, podA, 2, srcA, vip, 2, 28)
	h.c.Handle(a)
	d := withCT(dnsEv(event.KindDrop, 1e9+10_000, node, 2, srcA, vip, 2, 28), 0xB, 0, event.Tuple{Src: srcA, Dst: vip, Proto: 17}, snated)
	d.Reason = reasonNetfilter
	h.c.Handle(d)
	h.c.Close(1e9 + 10*1000*ms)
	if len(h.incidents) != 1 || h.incidents[0].Cause != CauseRuleDrop || h.incidents[0].Retried {
		t.Fatalf("%+v", h.incidents)
	}
	if a := h.c.Attributed()[node]; a.InsertFailed != 0 {
		t.Fatalf("attributed %+v", a)
	}
}

// A netfilter drop with no entry at all is table_full while the node's drop
// counter has room, and rule_drop after that.
func TestTableFullBudget(t *testing.T) {
	h := newHarness(fakeCounters{node: {Drop: 1}})
	for i, id := range []uint16{10, 11} {
		ts := uint64(1e9) + uint64(i)*1000*ms
		src := netip.AddrPortFrom(srcA.Addr(), uint16(7000+i))
		h.c.Handle(dnsEv(event.KindXmit, ts, podA, uint64(20+i), src, vip, id, 1))
		d := dnsEv(event.KindDrop, ts+1000, node, uint64(20+i), src, vip, id, 1)
		d.Reason = reasonNetfilter
		h.c.Handle(d)
		h.c.Tick(ts + 500*ms)
	}
	h.c.Close(uint64(1e9) + 20*1000*ms)
	causes := map[string]int{}
	for _, inc := range h.incidents {
		for _, p := range inc.Lost {
			causes[p.Cause]++
		}
	}
	if causes[CauseTableFull] != 1 || causes[CauseRuleDrop] != 1 {
		t.Fatalf("causes %v", causes)
	}
}

// An answer dropped for want of a socket makes the query reply_unmatched
// once the retry shows it was never answered.
func TestReplyUnmatched(t *testing.T) {
	h := newHarness(fakeCounters{})
	q := dnsEv(event.KindXmit, 1e9, podA, 5, srcA, vip, 7, 1)
	h.c.Handle(q)
	r := dnsEv(event.KindDrop, 1e9+ms, node, 6, netip.MustParseAddrPort("10.96.100.12:53"), netip.MustParseAddrPort("10.96.100.1:10001"), 7, 1)
	r.DNS.Response, r.Reason = true, reasonNoSocket
	h.c.Handle(r)
	h.c.Handle(dnsEv(event.KindXmit, 1e9+5000*ms, podA, 8, srcA, vip, 7, 1))
	if len(h.incidents) != 1 || h.incidents[0].Cause != CauseReplyUnmatched || *h.incidents[0].StallMs != 5000 {
		t.Fatalf("%+v", h.incidents)
	}
}

// An answered query is never an incident, and a query in flight when the
// trace ends is not declared lost.
func TestAnsweredAndInFlight(t *testing.T) {
	h := newHarness(fakeCounters{})
	q := dnsEv(event.KindXmit, 1e9, podA, 5, srcA, vip, 7, 1)
	h.c.Handle(q)
	h.c.Handle(answer(1e9+ms, podA, q))
	h.c.Handle(dnsEv(event.KindXmit, 1e9+10*ms, podA, 6, srcA, vip, 8, 28))
	h.c.Close(1e9 + 100*ms)
	if len(h.incidents) != 0 {
		t.Fatalf("%+v", h.incidents[0])
	}
	if s := h.c.Stats(); s.Queries != 2 || s.Answered != 1 {
		t.Fatalf("%+v", s)
	}
}

// A loser merged into the winner: its unconfirmed entry is freed without a
// drop, one clash_resolved incident; the free of a dropped packet's entry
// is not one.
func TestClashResolvedMerged(t *testing.T) {
	h := newHarness(fakeCounters{})
	orig := event.Tuple{Src: srcA, Dst: vip, Proto: 17}
	h.c.Handle(dnsEv(event.KindXmit, 1e9, podA, 5, srcA, vip, 7, 1))
	h.c.Handle(withCT(dnsEv(event.KindXmit, 1e9+ms, node, 5, srcA, vip, 7, 1), 0xA, event.IPSConfirmed, orig, orig.Reverse()))
	free := &event.Event{Kind: event.KindCTFree, TimeNs: 1e9 + ms, NetNS: node, CT: event.CT{Ptr: 0xB, Orig: orig, Reply: orig.Reverse()}}
	h.c.Handle(free)
	// A dropped packet's entry, freed right after the drop: not a rescue.
	h.c.Handle(dnsEv(event.KindXmit, 1e9+2*ms, podB, 9, srcB, vip, 9, 1))
	d := withCT(dnsEv(event.KindDrop, 1e9+3*ms, node, 9, srcB, vip, 9, 1), 0xC, 0, event.Tuple{Src: srcB, Dst: vip, Proto: 17}, snated)
	d.Reason = reasonNetfilter
	h.c.Handle(d)
	// (Under emulation the free can trail the drop by tens of ms.)
	h.c.Handle(&event.Event{Kind: event.KindCTFree, TimeNs: 1e9 + 3*ms + 40*ms, NetNS: node,
		CT: event.CT{Ptr: 0xC, Orig: event.Tuple{Src: srcB, Dst: vip, Proto: 17}, Reply: snated}})
	h.c.Tick(1e9 + 500*ms)
	var rescued int
	for _, inc := range h.incidents {
		if inc.Cause == CauseClashResolved {
			rescued++
			if inc.Winner == nil || inc.Winner.Src != srcA.String() {
				t.Errorf("winner %+v", inc.Winner)
			}
		}
	}
	if rescued != 1 || h.c.Attributed()[node].ClashResolve != 1 {
		t.Fatalf("%d rescued, attributed %+v", rescued, h.c.Attributed()[node])
	}
}

func TestRetryRecorded(t *testing.T) {
	h := newHarness(fakeCounters{})
	h.c.Handle(dnsEv(event.KindXmit, 1e9, podA, 5, srcA, vip, 7, 1))
	retrySrc := netip.MustParseAddrPort("10.244.0.10:6001")
	h.c.Handle(dnsEv(event.KindXmit, 1e9+5000*ms, podA, 8, retrySrc, vip, 9, 1))
	if len(h.incidents) != 1 {
		t.Fatalf("%d incidents", len(h.incidents))
	}
	r := h.incidents[0].Retry
	if r == nil || r.ID != 9 || r.Src != retrySrc.String() || r.QType != "A" {
		t.Fatalf("retry %+v", r)
	}
}

// Two pods ask with the same id and type; the second's packet lands in the
// first's freed skb. The name tells them apart: both are queries.
func TestReusedSkbOtherQuestion(t *testing.T) {
	h := newHarness(fakeCounters{})
	h.c.Handle(dnsEv(event.KindXmit, 1e9, podA, 5, srcA, vip, 6, 28))
	e := dnsEv(event.KindXmit, 1e9+3*ms, podB, 5, srcB, vip, 6, 28)
	e.DNS.SetQName("svc-01.lab.test")
	h.c.Handle(e)
	if s := h.c.Stats(); s.Queries != 2 {
		t.Fatalf("%d queries seen, want 2", s.Queries)
	}
}
