package correlate

import (
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsrace/dnsrace/internal/event"
)

// These tests hold the correlator to one incident per stalled lookup,
// whatever the cause and however many of its queries and attempts were
// lost, while the per-packet counts (lost queries, attributed kernel
// counters) still count packets.

// lostIDs lists an incident's lost packets as type/id.
func lostIDs(inc *Incident) []string {
	var out []string
	for _, p := range inc.Lost {
		out = append(out, p.QType.String()+"/"+strconv.Itoa(int(p.ID))+" "+p.Cause)
	}
	return out
}

func stallMs(inc *Incident) float64 {
	if inc.StallMs == nil {
		return -1
	}
	return *inc.StallMs
}

// A and AAAA of one attempt, both dropped by a rule on one socket: one
// incident with both packets.
func TestBothQueriesOfAnAttemptOneIncident(t *testing.T) {
	h := newHarness(t, nil)
	a := h.query(0, podA, srcA, 1, dns.TypeA)
	aaaa := h.query(10, podA, srcA, 2, dns.TypeAAAA)
	h.handle(drop(20, a, reasonNetfilter, 1, event.CT{}))
	h.handle(drop(30, aaaa, reasonNetfilter, 1, event.CT{}))
	h.c.Tick(400 * ms)
	h.retried(5*sec, podA, srcA, 1, dns.TypeA)
	h.retried(5*sec+10, podA, srcA, 2, dns.TypeAAAA)
	h.c.Tick(6 * sec)
	inc := h.only(CauseRuleDrop)
	if got := lostIDs(inc); len(got) != 2 || got[0] != "A/1 rule_drop" || got[1] != "AAAA/2 rule_drop" {
		t.Errorf("lost %v, want A/1 and AAAA/2, both rule_drop", got)
	}
	if ms := stallMs(inc); !inc.Retried || ms < 4999 || ms > 5001 {
		t.Errorf("retried %v, stall %.3f ms; want the retry 5 s after the first lost query", inc.Retried, ms)
	}
	if st := h.c.Stats(); st.Lost != 2 {
		t.Errorf("lost %d queries, want 2: the packets are still counted", st.Lost)
	}
}

// Two lookups, in two pods or one after the other in one pod (new ids):
// two incidents.
func TestTwoLookupsTwoIncidents(t *testing.T) {
	t.Run("two pods", func(t *testing.T) {
		h := newHarness(t, nil)
		a := h.query(0, podA, srcA, 1, dns.TypeA)
		b := h.query(5, podB, srcB, 1, dns.TypeA)
		h.handle(drop(20, a, reasonNetfilter, 1, event.CT{}))
		h.handle(drop(25, b, reasonNetfilter, 1, event.CT{}))
		h.c.Tick(400 * ms)
		h.retried(5*sec, podA, srcA, 1, dns.TypeA)
		h.retried(5*sec+5, podB, srcB, 1, dns.TypeA)
		if len(h.incidents) != 2 || h.incidents[0].NetNS == h.incidents[1].NetNS {
			t.Fatalf("%d incidents %+v, want one per pod", len(h.incidents), h.incidents)
		}
	})
	t.Run("one pod, one after the other", func(t *testing.T) {
		// A lookup that gave up after its second attempt, and the next
		// lookup of the same name (new ids): its first query ends the
		// first stall, and its own loss is another stall.
		h := newHarness(t, nil)
		for _, at := range []uint64{0, 5 * sec} { // the first lookup, AAAA lost twice
			h.answer(at+ms, h.query(at, podA, srcA, 1, dns.TypeA))
			h.handle(drop(at+2*ms, h.query(at+2*ms, podA, srcA, 2, dns.TypeAAAA), reasonNetfilter, 1, event.CT{}))
			h.c.Tick(at + 400*ms)
		}
		h.answer(10*sec+ms, h.query(10*sec, podA, srcB, 3, dns.TypeA)) // the next lookup, new socket and ids
		h.handle(drop(10*sec+2*ms, h.query(10*sec+2*ms, podA, srcB, 4, dns.TypeAAAA), reasonNetfilter, 1, event.CT{}))
		h.c.Tick(10*sec + 400*ms)
		h.c.Close(11 * sec)
		if len(h.incidents) != 2 {
			t.Fatalf("%d incidents, want 2 (one per lookup): %+v", len(h.incidents), h.incidents)
		}
		first, second := h.incidents[0], h.incidents[1]
		if got := lostIDs(first); len(got) != 2 || first.Retry == nil || first.Retry.ID != 3 || stallMs(first) != 9998 {
			t.Errorf("first lookup: lost %v retry %+v stall %.3f ms; want both AAAA/2, ended 9998 ms after the first by the next lookup's A",
				got, first.Retry, stallMs(first))
		}
		if got := lostIDs(second); len(got) != 1 || got[0] != "AAAA/4 rule_drop" || second.Retried {
			t.Errorf("second lookup: lost %v retried %v; want AAAA/4, no retry", got, second.Retried)
		}
	})
}

// glibc's lookup that lost its AAAA in two attempts: the second attempt
// resends A first (answered), then AAAA (lost again), and the third
// attempt, on new sockets, is answered. One incident, the stall from the
// first lost query to the third attempt, every lost packet in it; and the
// kernel counters are attributed per packet.
func TestLookupLostTwiceOneIncident(t *testing.T) {
	for _, c := range []struct {
		name string
		// lose loses the query AAAA qid sent at 'at'.
		lose     func(h *harness, at, qid uint64)
		cause    string
		counters fakeCounters
		attrib   Attributed
	}{
		{"rule drops", func(h *harness, at, qid uint64) {
			h.handle(drop(at+10, qid, reasonNetfilter, 1, event.CT{}))
		}, CauseRuleDrop, nil, Attributed{}},
		{"insert races", func(h *harness, at, qid uint64) {
			h.handle(withWinner(drop(at+10, qid, reasonNetfilter, 1, entry(0xa0+at, srcA, 10001, false)),
				entry(0xb0+at, srcB, 10001, true), 0))
		}, CauseInsertRace, fakeCounters{node: {InsertFailed: 2, Drop: 2}}, Attributed{InsertFailed: 2, Drop: 2}},
		{"unanswered, found lost at the next attempt", func(*harness, uint64, uint64) {}, CauseNoReply, nil, Attributed{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, c.counters)
			for _, at := range []uint64{0, 5 * sec} {
				h.answer(at+ms, h.query(at, podA, srcA, 1, dns.TypeA))
				c.lose(h, at+2*ms, h.query(at+2*ms, podA, srcA, 2, dns.TypeAAAA))
				h.c.Tick(at + 400*ms)
				h.c.Tick(at + 2*sec)
			}
			if len(h.incidents) != 0 {
				t.Fatalf("an incident before the lookup's attempt that lost nothing: %+v", h.incidents)
			}
			srcA2 := netip.AddrPortFrom(srcA.Addr(), 6001)
			h.answer(10*sec+ms, h.query(10*sec, podA, srcA2, 1, dns.TypeA))
			h.answer(10*sec+3*ms, h.query(10*sec+2*ms, podA, srcA2, 2, dns.TypeAAAA))
			h.c.Tick(11 * sec)
			inc := h.only(c.cause)
			if got := lostIDs(inc); len(got) != 2 || got[0] != "AAAA/2 "+c.cause || got[1] != "AAAA/2 "+c.cause {
				t.Errorf("lost %v, want AAAA/2 twice", got)
			}
			if ms := stallMs(inc); !inc.Retried || ms < 9997 || ms > 9999 || inc.Retry == nil || inc.Retry.Src != srcA2 {
				t.Errorf("stall %.3f ms, retry %+v; want 9998 ms, to the third attempt's A", ms, inc.Retry)
			}
			if got := h.c.Attributed()[node]; got != c.attrib {
				t.Errorf("attributed %+v, want %+v: one per packet", got, c.attrib)
			}
			if st := h.c.Stats(); st.Lost != 2 {
				t.Errorf("lost %d, want 2", st.Lost)
			}
		})
	}
}

// A lookup whose every attempt loses (glibc gave up): one incident when no
// retry comes, QueryTTL (and MinRetryGap, for the attempt's other
// queries) after its last attempt, not at the first one's.
func TestLookupWithoutAnsweredAttempt(t *testing.T) {
	h := newHarness(t, nil)
	for _, at := range []uint64{0, 5 * sec, 10 * sec} {
		h.answer(at+ms, h.query(at, podA, srcA, 1, dns.TypeA))
		h.handle(drop(at+2*ms, h.query(at+2*ms, podA, srcA, 2, dns.TypeAAAA), reasonNetfilter, 1, event.CT{}))
		h.c.Tick(at + 400*ms)
	}
	h.c.Tick(13 * sec)
	if len(h.incidents) != 0 {
		t.Fatalf("reported at the first attempt's QueryTTL: %+v", h.incidents)
	}
	h.c.Tick(22*sec + 2*ms + uint64(h.c.cfg.MinRetryGap))
	inc := h.only(CauseRuleDrop)
	// It waited at least until its third attempt (then gave up).
	if len(inc.Lost) != 3 || inc.Retried || !inc.StallAtLeast || stallMs(inc) != 9998 {
		t.Errorf("lost %v retried %v stall %.3f (at least %v); want 3 lost, no retry, at least the 9998 ms to its last attempt",
			lostIDs(inc), inc.Retried, stallMs(inc), inc.StallAtLeast)
	}
	// Its first attempt's A, forgotten since (QueryTTL), is still named.
	if s := inc.Sibling; s == nil || s.QType != QType(dns.TypeA) || s.ID != 1 || !s.Answered {
		t.Errorf("sibling %+v, want the first attempt's A, answered", s)
	}
}

// The same when the last attempt's loss is found only at its own
// QueryTTL (never answered, no drop seen): the stall waits for it, though
// the attempt before began more than QueryTTL earlier (the lab's
// upstream-loss scenario: glibc gave up after its third attempt).
func TestLookupWaitsForItsLastAttempt(t *testing.T) {
	h := newHarness(t, nil)
	h.query(0, podA, srcA, 1, dns.TypeA) // never answered
	h.answer(ms, h.query(10, podA, srcA, 2, dns.TypeAAAA))
	for _, at := range []uint64{5 * sec, 10 * sec} { // A answered, AAAA never
		src := srcA
		if at == 10*sec {
			src = netip.AddrPortFrom(srcA.Addr(), 6001) // glibc reopens its sockets
		}
		h.answer(at+ms, h.query(at, podA, src, 1, dns.TypeA))
		h.query(at+2*ms, podA, src, 2, dns.TypeAAAA)
		h.c.Tick(at + 500*ms)
	}
	for now := 11 * sec; now <= 23*sec; now += sec {
		h.c.Tick(now)
	}
	h.c.Close(24 * sec)
	inc := h.only(CauseNoReply)
	if got := lostIDs(inc); len(got) != 3 || got[0] != "A/1 no_reply" || got[1] != "AAAA/2 no_reply" || got[2] != "AAAA/2 no_reply" {
		t.Errorf("lost %v, want A/1 and AAAA/2 twice", got)
	}
	if inc.Retried {
		t.Errorf("retried at %+v: no retry ended the lookup", inc.Retry)
	}
}

// A retry with a new id (Go's resolver, or another lookup) ends the stall
// at once: nothing says it is the same lookup.
func TestRetryWithNewIDEndsTheStall(t *testing.T) {
	h := newHarness(t, nil)
	a := h.query(0, podA, srcA, 1, dns.TypeA)
	h.handle(drop(10, a, reasonNetfilter, 1, event.CT{}))
	h.c.Tick(400 * ms)
	h.query(5*sec, podA, srcB, 9, dns.TypeA)
	if inc := h.only(CauseRuleDrop); inc.Retry == nil || inc.Retry.ID != 9 || stallMs(inc) != 5000 {
		t.Errorf("retry %+v stall %.3f ms", inc.Retry, stallMs(inc))
	}
}

// A retry's attempt that resent every query of the lookup, all answered,
// is over at once: a resolver sends a query once an attempt. One that
// resent only some (musl resends the unanswered ones; glibc's single-
// request mode sends AAAA only after A's answer) is over MinRetryGap
// after its retry, or goes on when the rest is lost.
func TestAttemptOverOnceEveryQueryIsResent(t *testing.T) {
	const at = 5 * sec
	gap := uint64(400 * ms)
	t.Run("both resent and answered", func(t *testing.T) {
		h := newHarness(t, nil)
		h.answer(ms, h.query(0, podA, srcA, 1, dns.TypeA))
		h.handle(drop(2*ms, h.query(ms, podA, srcA, 2, dns.TypeAAAA), reasonNetfilter, 1, event.CT{}))
		h.c.Tick(400 * ms)
		h.answer(at+ms, h.query(at, podA, srcA, 1, dns.TypeA))
		h.answer(at+2*ms, h.query(at+10, podA, srcA, 2, dns.TypeAAAA))
		h.c.Tick(at + 50*ms)
		inc := h.only(CauseRuleDrop)
		if ms := stallMs(inc); ms < 4998 || ms > 5000 || inc.Retry == nil || inc.Retry.QType != QType(dns.TypeA) {
			t.Errorf("stall %.3f ms, retry %+v; want 4999 ms, to the resent A", ms, inc.Retry)
		}
	})
	t.Run("one resent, the other answered before", func(t *testing.T) {
		h := newHarness(t, nil)
		h.handle(drop(10, h.query(0, podA, srcA, 1, dns.TypeA), reasonNetfilter, 1, event.CT{}))
		h.answer(2*ms, h.query(ms, podA, srcA, 2, dns.TypeAAAA))
		h.c.Tick(400 * ms)
		h.answer(at+ms, h.query(at, podA, srcA, 1, dns.TypeA))
		h.c.Tick(at + 50*ms)
		if len(h.incidents) != 0 {
			t.Fatalf("the attempt ended before MinRetryGap though its AAAA may still come: %+v", h.incidents)
		}
		h.c.Tick(at + gap)
		if inc := h.only(CauseRuleDrop); stallMs(inc) != 5000 {
			t.Errorf("stall %.3f ms, want 5000", stallMs(inc))
		}
	})
	t.Run("single request: AAAA after A's answer, lost again", func(t *testing.T) {
		h := newHarness(t, nil)
		h.answer(ms, h.query(0, podA, srcA, 1, dns.TypeA))
		h.handle(drop(2*ms, h.query(ms, podA, srcA, 2, dns.TypeAAAA), reasonNetfilter, 1, event.CT{}))
		h.c.Tick(400 * ms)
		h.answer(at+ms, h.query(at, podA, srcA, 1, dns.TypeA))
		h.c.Tick(at + 2*ms)
		aaaa := h.query(at+3*ms, podA, srcA, 2, dns.TypeAAAA)
		h.c.Tick(at + 4*ms)
		h.handle(drop(at+4*ms, aaaa, reasonNetfilter, 1, event.CT{}))
		h.c.Tick(at + gap)
		if len(h.incidents) != 0 {
			t.Fatalf("the lookup's incident before its attempt that lost nothing: %+v", h.incidents)
		}
		h.retried(2*at, podA, srcA, 1, dns.TypeA)
		inc := h.only(CauseRuleDrop)
		if got := lostIDs(inc); len(got) != 2 || stallMs(inc) != 2*5000-1 {
			t.Errorf("lost %v, stall %.3f ms; want AAAA/2 twice, 9999 ms", got, stallMs(inc))
		}
	})
}

// Go's resolver asks A and AAAA at once, each on a socket of its own, and
// asks again on new sockets with new ids after its timeout: a lookup
// never answered is one incident per attempt waited out, each with both
// queries, whatever order the losses are found in.
func TestGoLookupOneIncidentPerTimeout(t *testing.T) {
	h := newHarness(t, nil)
	port := uint16(7000)
	sock := func() netip.AddrPort { port++; return netip.AddrPortFrom(srcA.Addr(), port) }
	h.query(0, podA, sock(), 1, dns.TypeA)
	h.query(200*uint64(time.Microsecond), podA, sock(), 2, dns.TypeAAAA)
	for at := uint64(ms); at < 5*sec; at += 500 * ms {
		h.c.Tick(at)
	}
	h.query(5*sec, podA, sock(), 4, dns.TypeAAAA) // the AAAA goroutine first
	h.query(5*sec+300*uint64(time.Microsecond), podA, sock(), 3, dns.TypeA)
	for at := 5*sec + ms; at < 10*sec; at += 500 * ms {
		h.c.Tick(at)
	}
	// No retry: the queries expire (QueryTTL), each at its own tick.
	ttl := uint64(h.c.cfg.QueryTTL)
	for at := 5*sec + ttl - ms; at < 5*sec+ttl+2*ms; at += 100 * uint64(time.Microsecond) {
		h.c.Tick(at)
	}
	h.c.Close(5*sec + ttl + sec)
	if len(h.incidents) != 2 {
		for _, inc := range h.incidents {
			t.Logf("incident %d: lost %v retried %v", inc.ID, lostIDs(inc), inc.Retried)
		}
		t.Fatalf("%d incidents, want 2: one per timeout", len(h.incidents))
	}
	for i, want := range [][]string{{"A/1 no_reply", "AAAA/2 no_reply"}, {"AAAA/4 no_reply", "A/3 no_reply"}} {
		got := lostIDs(h.incidents[i])
		if len(got) != 2 || !(got[0] == want[0] && got[1] == want[1] || got[0] == want[1] && got[1] == want[0]) {
			t.Errorf("incident %d: lost %v, want %v", i, got, want)
		}
	}
}
