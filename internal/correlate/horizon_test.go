package correlate

import (
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsrace/dnsrace/internal/event"
)

// These tests hold OldestOpen to what a writer needs to put stalls in the
// order they started: no stall reported later started before it.

const sec = uint64(time.Second)

// OldestOpen is the earliest start of a stall not reported yet: a query
// still waiting for its answer may become one, started when it was sent,
// and so may a dropped query whose drop is not decided yet.
func TestOldestOpenCountsWhatMayStillStall(t *testing.T) {
	h := newHarness(t, nil)
	if o := h.c.OldestOpen(); o != 0 {
		t.Fatalf("OldestOpen %d with nothing going on", o)
	}
	a := h.query(1*sec, podA, srcA, 1, dns.TypeA)
	h.answer(1*sec+ms, h.query(2*sec, podB, srcB, 1, dns.TypeA))
	if o := h.c.OldestOpen(); o != 1*sec {
		t.Errorf("OldestOpen %d, want %d: the unanswered query", o, 1*sec)
	}
	h.answer(1*sec+2*ms, a)
	if o := h.c.OldestOpen(); o != 0 {
		t.Errorf("OldestOpen %d, want 0 once every query is answered", o)
	}
	// A query first seen where its answer cannot be (forwarded), dropped:
	// not waiting for an answer, but its drop is not decided yet.
	h.qid++
	e := &event.Event{Kind: event.KindQuery, QID: h.qid, TimeNs: 3 * sec, NetNS: node, Flags: event.FlagNoSocket,
		Packet: event.Tuple{Src: srcA, Dst: vip, Proto: 17}}
	e.DNS.Valid, e.DNS.ID, e.DNS.QType = true, 7, dns.TypeA
	e.DNS.SetQName("svc-00.lab.test")
	h.handle(e)
	h.handle(drop(3*sec+10, h.qid, reasonNetfilter, 1, event.CT{}))
	if o := h.c.OldestOpen(); o != 3*sec {
		t.Errorf("OldestOpen %d, want %d: the undecided drop's query", o, 3*sec)
	}
	h.c.Tick(3*sec + 400*ms)
	if o := h.c.OldestOpen(); o != 3*sec {
		t.Errorf("OldestOpen %d, want %d: its stall", o, 3*sec)
	}
}

// Headlines in the order stalls started: a query that is never answered
// is found lost only at its retry (or QueryTTL); a stall that started
// later and ended first must not be released before it.
func TestLateFoundStallHoldsLaterOnes(t *testing.T) {
	h := newHarness(t, nil)
	h.query(500*ms, podA, srcA, 1, dns.TypeA) // no answer: its stall is found at the retry, 5 s later
	b := h.query(1*sec, podB, srcB, 1, dns.TypeA)
	h.handle(drop(1*sec+10, b, reasonNetfilter, 1, event.CT{}))
	h.c.Tick(1*sec + 400*ms)
	h.query(3*sec, podB, srcB, 2, dns.TypeA) // another lookup ends podB's stall at once
	if len(h.incidents) != 1 || h.incidents[0].NetNS != podB {
		t.Fatalf("incidents %+v, want podB's", h.incidents)
	}
	if o := h.c.OldestOpen(); o != 500*ms {
		t.Errorf("OldestOpen %d, want %d: podA's unanswered query, sent before podB's stall started", o, 500*ms)
	}
	h.query(5500*ms, podA, srcA, 3, dns.TypeA)
	if len(h.incidents) != 2 || h.incidents[1].NetNS != podA || h.incidents[1].Cause != CauseNoReply {
		t.Fatalf("incidents %+v, want podA's no_reply second", h.incidents)
	}
}
