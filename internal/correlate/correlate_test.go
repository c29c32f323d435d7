package correlate

import (
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/event"
)

// These tests feed the correlator records as the kernel side sends them
// (no kernel needed) and check every cause and race kind. The kernel's
// behaviour behind them is checked by the trace package's end-to-end tests.

const (
	podA, podB, node = 100, 101, 200
	reasonNetfilter  = 1
	reasonNoSocket   = 2
	reasonRcvbuf     = 3
	reasonOther      = 4
	// reasonNone: a 5.10 drop, which carries no reason (DropReasonName
	// gives "" there).
	reasonNone      = 5
	reasonOtherhost = 6
	ms              = uint64(time.Millisecond)

	loc510Netfilter, loc510NoSocket = 10, 11
	// locSocketClose: where 6.12 frees what a closing UDP socket still
	// holds (NOT_SPECIFIED).
	locSocketClose = 12
)

var (
	vip      = netip.MustParseAddrPort("10.96.0.10:53")
	backend  = netip.MustParseAddrPort("10.96.100.11:53")
	nodeAddr = netip.MustParseAddr("10.96.100.1")
	srcA     = netip.MustParseAddrPort("10.244.0.10:6000")
	srcB     = netip.MustParseAddrPort("10.244.0.11:5000")
)

type fakeCounters map[uint32]ctstats.Counters

func (f fakeCounters) Delta(ns uint32) (ctstats.Counters, bool) { c, ok := f[ns]; return c, ok }

type harness struct {
	t         *testing.T
	c         *Correlator
	incidents []*Incident
	qid       uint64
}

func newHarness(t *testing.T, counters fakeCounters) *harness {
	return newHarnessWith(t, counters, nil)
}

// newHarnessWith is newHarness with the configuration changed by set.
func newHarnessWith(t *testing.T, counters fakeCounters, set func(*Config)) *harness {
	h := &harness{t: t}
	cfg := Config{
		Counters: counters,
		// Incidents at the tick their stall ends: tests of forwarders
		// set a grace of their own.
		ForwarderGrace: -1,
		ReasonName: func(v uint32) string {
			return map[uint32]string{0: "NOT_SPECIFIED", reasonNetfilter: "NETFILTER_DROP", reasonNoSocket: "NO_SOCKET",
				reasonRcvbuf: "SOCKET_RCVBUFF", reasonOther: "IP_OUTNOROUTES", reasonOtherhost: "OTHERHOST"}[v]
		},
		Symbol: func(a uint64) (string, uint64, bool) {
			s, ok := map[uint64]struct {
				name string
				off  uint64
			}{1: {"nf_hook_slow", 0x7d}, 2: {"__udp4_lib_rcv", 0x3a0}, 3: {"ip_finish_output2", 0x10},
				// Where Debian 11's 5.10.0-32-cloud-amd64 freed the lab's
				// lost packets (make vmtest: insert_race, table_full and
				// rule_drop; reply_unmatched).
				loc510Netfilter: {"nf_hook_slow", 0x93}, loc510NoSocket: {"__udp4_lib_rcv", 0x992},
				locSocketClose: {"udp_destruct_common", 0xbd}}[a]
			return s.name, s.off, ok
		},
		OnIncident: func(inc *Incident) { h.incidents = append(h.incidents, inc) },
	}
	if set != nil {
		set(&cfg)
	}
	h.c = New(cfg)
	return h
}

// query sends a QUERY record and returns its qid.
func (h *harness) query(t uint64, ns uint32, src netip.AddrPort, id, qtype uint16) uint64 {
	h.qid++
	e := &event.Event{Kind: event.KindQuery, Flags: event.FlagSender, QID: h.qid, TimeNs: t, NetNS: ns, CPU: uint16(h.qid % 2),
		Packet: event.Tuple{Src: src, Dst: vip, Proto: 17}, Tier: event.TierTracepoint, PID: 4242}
	copy(e.Comm[:], "getent")
	e.DNS.Valid, e.DNS.ID, e.DNS.QType = true, id, qtype
	e.DNS.SetQName("svc-00.lab.test")
	h.c.Handle(e)
	return h.qid
}

func (h *harness) answer(t uint64, qid uint64) {
	h.c.Handle(&event.Event{Kind: event.KindAnswer, QID: qid, TimeNs: t, Flags: event.FlagResponse})
}

// retried sends a lookup's retry (a resend: the lost query's id), its
// answer a millisecond later, and a tick once its attempt is over
// (MinRetryGap): the stall ends at a retry whose attempt lost nothing.
func (h *harness) retried(t uint64, ns uint32, src netip.AddrPort, id, qtype uint16) uint64 {
	q := h.query(t, ns, src, id, qtype)
	h.answer(t+ms, q)
	h.c.Tick(t + uint64(h.c.cfg.MinRetryGap))
	return q
}

func (h *harness) handle(e *event.Event) { h.c.Handle(e) }

// entry is a conntrack entry of a pod's flow to the VIP, DNATed to the
// backend and SNATed to the node's port.
func entry(ptr uint64, src netip.AddrPort, snatPort uint16, confirmed bool) event.CT {
	ct := event.CT{Ptr: ptr,
		Orig:  event.Tuple{Src: src, Dst: vip, Proto: 17},
		Reply: event.Tuple{Src: backend, Dst: netip.AddrPortFrom(nodeAddr, snatPort), Proto: 17}}
	if confirmed {
		ct.Status = event.IPSConfirmed
	}
	return ct
}

// drop is an EV_DROP record of query qid in the node.
func drop(t, qid uint64, reason uint32, loc uint64, ct event.CT) *event.Event {
	return &event.Event{Kind: event.KindDrop, QID: qid, TimeNs: t, NetNS: node, Reason: reason, Location: loc, CT: ct}
}

func withWinner(e *event.Event, w event.CT, wqid uint64) *event.Event {
	e.Flags |= event.FlagWinner
	e.Winner, e.WinnerQID = w, wqid
	return e
}

func (h *harness) only(cause string) *Incident {
	h.t.Helper()
	if len(h.incidents) != 1 {
		h.t.Fatalf("%d incidents, want 1 %s: %+v", len(h.incidents), cause, h.incidents)
	}
	inc := h.incidents[0]
	if inc.Cause != cause {
		h.t.Fatalf("cause %s, want %s", inc.Cause, cause)
	}
	return inc
}

func race(inc *Incident) string {
	if inc.Race == nil {
		return ""
	}
	return *inc.Race
}

func TestAnsweredQueriesMakeNoIncident(t *testing.T) {
	h := newHarness(t, nil)
	a := h.query(0, podA, srcA, 1, dns.TypeA)
	b := h.query(10, podA, srcA, 2, dns.TypeAAAA)
	h.answer(1*ms, a)
	h.answer(1*ms, b)
	h.c.Tick(20 * ms)
	h.c.Close(30 * ms)
	if len(h.incidents) != 0 {
		t.Fatalf("incidents: %+v", h.incidents)
	}
	if st := h.c.Stats(); st.Queries != 2 || st.Answered != 2 || st.InFlight != 0 {
		t.Errorf("stats %+v", st)
	}
}

// The SNAT port race, tracepoint tier: the drop names the flow that holds
// the loser's reply tuple; the retry 5 s later ends the stall.
func TestInsertRaceReplyClash(t *testing.T) {
	h := newHarness(t, fakeCounters{node: {InsertFailed: 1, Drop: 1}})
	w := h.query(0, podB, srcB, 7, dns.TypeA) // the winner's query
	a := h.query(10, podA, srcA, 1, dns.TypeA)
	aaaa := h.query(11, podA, srcA, 2, dns.TypeAAAA)
	h.answer(ms, w)
	h.answer(ms, aaaa)
	loser := entry(0xa, srcA, 10001, false)
	winner := entry(0xb, srcB, 10001, true)
	h.handle(withWinner(drop(50, a, reasonNetfilter, 1, loser), winner, w))
	h.c.Tick(400 * ms)
	if len(h.incidents) != 0 {
		t.Fatal("incident before the retry")
	}
	h.retried(5*uint64(time.Second), podA, srcA, 1, dns.TypeA) // glibc's retry: same socket, same id
	inc := h.only(CauseInsertRace)
	if race(inc) != RaceReplyClash || inc.StallMs == nil || *inc.StallMs < 4999 || !inc.Retried {
		t.Errorf("incident %+v", inc)
	}
	if inc.Winner == nil || inc.Winner.Src != srcB || inc.Winner.QName != "svc-00.lab.test" || inc.Winner.NetNS != podB ||
		inc.Winner.ReplyDst != netip.AddrPortFrom(nodeAddr, 10001) {
		t.Errorf("winner %+v", inc.Winner)
	}
	if inc.Sibling == nil || inc.Sibling.QType != QType(dns.TypeAAAA) || !inc.Sibling.Answered {
		t.Errorf("sibling %+v", inc.Sibling)
	}
	if len(inc.Lost) != 1 || inc.Lost[0].Reason != "NETFILTER_DROP" || inc.Lost[0].Location != "nf_hook_slow+0x7d" || inc.NodeNetNS != node {
		t.Errorf("lost %+v node %d", inc.Lost, inc.NodeNetNS)
	}
	if inc.Retry == nil || inc.Retry.ID != 1 || inc.Retry.Src != srcA {
		t.Errorf("retry %+v", inc.Retry)
	}
	if got := h.c.Attributed()[node]; got != (Attributed{InsertFailed: 1, Drop: 1}) {
		t.Errorf("attributed %+v", got)
	}
}

// The winner may reach a device after its loser's drop: the late winner
// (the holder of the reply tuple) wins over the same socket's entry that
// the drop found.
func TestLateReplyHolderWins(t *testing.T) {
	h := newHarness(t, fakeCounters{node: {InsertFailed: 1, Drop: 1}})
	a := h.query(0, podA, srcA, 1, dns.TypeA)
	aaaa := h.query(1, podA, srcA, 2, dns.TypeAAAA)
	w := h.query(2, podB, srcB, 9, dns.TypeA)
	h.answer(ms, a)
	h.answer(ms, w)
	loser := entry(0xa, srcA, 10001, false)
	sameSocket := entry(0xc, srcA, 10002, true)
	h.handle(withWinner(drop(50, aaaa, reasonNetfilter, 1, loser), sameSocket, a))
	h.handle(withWinner(&event.Event{Kind: event.KindWinner, QID: aaaa, TimeNs: 60, NetNS: node}, entry(0xb, srcB, 10001, true), w))
	h.c.Tick(400 * ms)
	h.c.Close(6 * uint64(time.Second))
	inc := h.only(CauseInsertRace)
	if race(inc) != RaceReplyClash || inc.Winner == nil || inc.Winner.Src != srcB {
		t.Errorf("race %s winner %+v", race(inc), inc.Winner)
	}
}

// The drop found no holder of either of the loser's tuples, and awaits
// both. The asking socket's next query then makes an entry with the
// loser's original tuple, at the loser's own address (the slab gives a CPU
// the entry it freed last: Linux 7.0+ does so nearly always): that is the
// loser's memory reused after it, no winner, whether it comes before the
// drop is classified or after.
func TestLosersAddressIsNoWinner(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(map[bool]string{false: "before classify", true: "after classify"}[late], func(t *testing.T) {
			h := newHarness(t, fakeCounters{node: {InsertFailed: 1, Drop: 1}})
			a := h.query(0, podA, srcA, 1, dns.TypeA)
			aaaa := h.query(1, podA, srcA, 2, dns.TypeAAAA)
			h.answer(ms, aaaa)
			h.handle(drop(50, a, reasonNetfilter, 1, entry(0xa, srcA, 10004, false)))
			reused := &event.Event{Kind: event.KindWinner, QID: a, TimeNs: 60, NetNS: node}
			if late {
				h.c.Tick(400 * ms)
				reused.TimeNs = 500 * ms
			}
			h.handle(withWinner(reused, entry(0xa, srcA, 10002, true), aaaa))
			h.c.Tick(900 * ms)
			h.c.Close(6 * uint64(time.Second))
			inc := h.only(CauseInsertRace)
			if race(inc) != "" || inc.Winner != nil {
				t.Errorf("race %q winner %+v, want none known", race(inc), inc.Winner)
			}
		})
	}
}

// The drop awaited both holders: the holder of the reply tuple comes
// first, then the asking socket's next flow (its own entry) with the
// loser's original tuple. The reply holder stays the winner.
func TestLateReplyHolderStays(t *testing.T) {
	h := newHarness(t, fakeCounters{node: {InsertFailed: 1, Drop: 1}})
	a := h.query(0, podA, srcA, 1, dns.TypeA)
	aaaa := h.query(1, podA, srcA, 2, dns.TypeAAAA)
	w := h.query(2, podB, srcB, 9, dns.TypeA)
	h.answer(ms, aaaa)
	h.answer(ms, w)
	h.handle(drop(50, a, reasonNetfilter, 1, entry(0xa, srcA, 10001, false)))
	h.handle(withWinner(&event.Event{Kind: event.KindWinner, QID: a, TimeNs: 60, NetNS: node}, entry(0xb, srcB, 10001, true), w))
	h.handle(withWinner(&event.Event{Kind: event.KindWinner, QID: a, TimeNs: 70, NetNS: node}, entry(0xc, srcA, 10002, true), aaaa))
	h.c.Tick(400 * ms)
	h.c.Close(6 * uint64(time.Second))
	inc := h.only(CauseInsertRace)
	if race(inc) != RaceReplyClash || inc.Winner == nil || inc.Winner.Src != srcB {
		t.Errorf("race %s winner %+v", race(inc), inc.Winner)
	}
}

// The fentry/kprobe tier: confirm said NF_DROP, with nf_ct_resolve_clash's
// winner: no counter budget is needed.
func TestInsertRaceConfirmDropSameTuple(t *testing.T) {
	h := newHarness(t, nil)
	a := h.query(0, podA, srcA, 1, dns.TypeA)
	aaaa := h.query(1, podA, srcA, 2, dns.TypeAAAA)
	h.answer(ms, a)
	loser := entry(0xa, srcA, 10001, false)
	winner := entry(0xb, srcA, 10002, true)
	h.handle(withWinner(&event.Event{Kind: event.KindConfirmDrop, QID: aaaa, TimeNs: 40, NetNS: node, CT: loser}, winner, 0))
	h.handle(drop(41, aaaa, reasonNetfilter, 1, loser))
	h.c.Tick(400 * ms)
	h.retried(5*uint64(time.Second), podA, srcA, 2, dns.TypeAAAA)
	inc := h.only(CauseInsertRace)
	if race(inc) != RaceSameTuple || inc.Winner == nil || inc.Winner.Src != srcA {
		t.Errorf("race %s winner %+v", race(inc), inc.Winner)
	}
}

// A drop reason tells the cause; without one (5.10), the freeing function.
func TestDropCauses(t *testing.T) {
	cases := []struct {
		name     string
		counters ctstats.Counters
		reason   uint32
		loc      uint64
		ct       event.CT
		cause    string
		attrib   Attributed
	}{
		{"unconfirmed entry, insert_failed room", ctstats.Counters{InsertFailed: 1, Drop: 1}, reasonNetfilter, 1, entry(0xa, srcA, 1, false), CauseInsertRace, Attributed{InsertFailed: 1, Drop: 1}},
		{"unconfirmed entry, no room: a rule", ctstats.Counters{}, reasonNetfilter, 1, entry(0xa, srcA, 1, false), CauseRuleDrop, Attributed{}},
		{"confirmed entry: a rule", ctstats.Counters{InsertFailed: 1}, reasonNetfilter, 1, entry(0xa, srcA, 1, true), CauseRuleDrop, Attributed{}},
		{"no entry, drop room: table full", ctstats.Counters{Drop: 1}, reasonNetfilter, 1, event.CT{}, CauseTableFull, Attributed{Drop: 1}},
		{"no entry, no room: a rule", ctstats.Counters{}, reasonNetfilter, 1, event.CT{}, CauseRuleDrop, Attributed{}},
		{"5.10: no reason, nf_hook_slow", ctstats.Counters{InsertFailed: 1, Drop: 1}, reasonNone, loc510Netfilter, entry(0xa, srcA, 1, false), CauseInsertRace, Attributed{InsertFailed: 1, Drop: 1}},
		{"5.10: no reason, nf_hook_slow, no room: a rule", ctstats.Counters{}, reasonNone, loc510Netfilter, entry(0xa, srcA, 1, false), CauseRuleDrop, Attributed{}},
		{"5.10: no reason, no entry, drop room: table full", ctstats.Counters{Drop: 1}, reasonNone, loc510Netfilter, event.CT{}, CauseTableFull, Attributed{Drop: 1}},
		{"5.10: no reason, another function", ctstats.Counters{InsertFailed: 1, Drop: 1}, reasonNone, 3, entry(0xa, srcA, 1, false), CauseLocalDrop, Attributed{}},
		{"NOT_SPECIFIED at nf_hook_slow", ctstats.Counters{InsertFailed: 1, Drop: 1}, 0, 1, entry(0xa, srcA, 1, false), CauseInsertRace, Attributed{InsertFailed: 1, Drop: 1}},
		{"another reason", ctstats.Counters{Drop: 1}, reasonOther, 3, event.CT{}, CauseLocalDrop, Attributed{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, fakeCounters{node: c.counters})
			a := h.query(0, podA, srcA, 1, dns.TypeA)
			h.handle(drop(10, a, c.reason, c.loc, c.ct))
			h.c.Tick(400 * ms)
			h.c.Close(6 * uint64(time.Second))
			inc := h.only(c.cause)
			if got := h.c.Attributed()[node]; got != c.attrib {
				t.Errorf("attributed %+v, want %+v", got, c.attrib)
			}
			if inc.Retried || inc.StallMs != nil {
				t.Errorf("no retry was seen: %+v", inc)
			}
		})
	}
}

// The counters' budget goes to drops with direct evidence first: a rule
// drop and a race in one window, one insert_failed.
func TestBudgetGoesToEvidenceFirst(t *testing.T) {
	h := newHarness(t, fakeCounters{node: {InsertFailed: 1, Drop: 1}})
	rule := h.query(0, podA, srcA, 1, dns.TypeA)
	raced := h.query(1, podB, srcB, 2, dns.TypeA)
	h.handle(drop(10, rule, reasonNetfilter, 1, entry(0xa, srcA, 1, false)))
	h.handle(withWinner(drop(11, raced, reasonNetfilter, 1, entry(0xb, srcB, 1, false)), entry(0xc, netip.MustParseAddrPort("10.244.0.12:7"), 1, true), 0))
	h.c.Tick(400 * ms)
	h.c.Close(6 * uint64(time.Second))
	causes := map[uint32]string{}
	for _, inc := range h.incidents {
		causes[inc.NetNS] = inc.Cause
	}
	if causes[podA] != CauseRuleDrop || causes[podB] != CauseInsertRace {
		t.Errorf("causes %v", causes)
	}
}

// Answers dropped where they land: matched by the kernel (QID), or by
// their question when no flow expected them.
func TestAnswerDrops(t *testing.T) {
	cases := []struct {
		name   string
		reason uint32
		loc    uint64
		byQID  bool
		cause  string
	}{
		{"not reverse-NATed", reasonNoSocket, 2, false, CauseReplyUnmatched},
		{"5.10: freed in __udp4_lib_rcv", reasonNone, loc510NoSocket, false, CauseReplyUnmatched},
		{"receive buffer full", reasonRcvbuf, 3, true, CauseRcvbufFull},
		{"another reason", reasonOther, 3, true, CauseLocalDrop},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, nil)
			a := h.query(0, podA, srcA, 1, dns.TypeA)
			e := &event.Event{Kind: event.KindDrop, TimeNs: ms, NetNS: node, Reason: c.reason, Location: c.loc, Flags: event.FlagResponse}
			if c.byQID {
				e.QID = a
			} else {
				e.DNS.Valid, e.DNS.Response, e.DNS.ID, e.DNS.QType = true, true, 1, dns.TypeA
				e.DNS.SetQName("svc-00.lab.test")
			}
			h.handle(e)
			h.retried(5*uint64(time.Second), podA, srcA, 1, dns.TypeA)
			inc := h.only(c.cause)
			if inc.Lost[0].NetNS != node || !inc.Retried {
				t.Errorf("incident %+v", inc)
			}
		})
	}
}

// An answer freed at its socket's close had reached its asker, who no
// longer read: it is no loss. In time, it is an answer like any other; at
// the asker's timeout, a late one.
func TestAnswerFreedAtClose(t *testing.T) {
	for _, c := range []struct {
		name    string
		at      uint64
		late    bool
		retried bool
	}{
		{"read never, in time", ms, false, false},
		{"at the asker's timeout", 5 * sec, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, nil)
			a := h.query(0, podA, srcA, 1, dns.TypeA)
			h.handle(&event.Event{Kind: event.KindDrop, QID: a, TimeNs: c.at, NetNS: podA, Location: locSocketClose, Flags: event.FlagResponse})
			if c.retried {
				h.retried(c.at+ms, podA, srcA, 1, dns.TypeA)
			}
			h.c.Tick(c.at + 10*sec)
			h.c.Close(c.at + 11*sec)
			if !c.late {
				if len(h.incidents) != 0 {
					t.Errorf("%d incidents (first %s), want none", len(h.incidents), h.incidents[0].Cause)
				}
				return
			}
			inc := h.only(CauseLateAnswer)
			if len(inc.Lost) != 1 || inc.Lost[0].AnsweredMs == nil || *inc.Lost[0].AnsweredMs != 5000 {
				t.Errorf("lost %+v, want the query answered at 5000 ms", inc.Lost)
			}
		})
	}
}

// A full receive buffer before 6.10 names only the socket: its unanswered
// queries are blamed.
func TestRcvbufFullBySocket(t *testing.T) {
	h := newHarness(t, nil)
	h.query(0, podA, srcA, 1, dns.TypeA)
	h.handle(&event.Event{Kind: event.KindRcvbufFull, TimeNs: ms, NetNS: podA, Flags: event.FlagResponse,
		Packet: event.Tuple{Src: vip, Dst: srcA, Proto: 17}})
	h.retried(5*uint64(time.Second), podA, srcA, 1, dns.TypeA)
	h.only(CauseRcvbufFull)
}

func TestNoReply(t *testing.T) {
	h := newHarness(t, nil)
	h.query(0, podA, srcA, 1, dns.TypeA)
	h.query(10, podA, srcA, 2, dns.TypeAAAA)
	h.query(5*uint64(time.Second), podA, srcA, 3, dns.TypeA)
	inc := h.only(CauseNoReply)
	if len(inc.Lost) != 2 || inc.Sibling == nil || !inc.Sibling.Lost {
		t.Errorf("lost %+v sibling %+v", inc.Lost, inc.Sibling)
	}
}

// Rescued races: one clash_resolved incident per loser, whichever records
// report it; a merged loser of the tracepoint tier is named by its socket.
func TestRescued(t *testing.T) {
	t.Run("merged, fentry", func(t *testing.T) {
		h := newHarness(t, nil)
		a := h.query(0, podA, srcA, 1, dns.TypeA)
		aaaa := h.query(1, podA, srcA, 2, dns.TypeAAAA)
		loser, winner := entry(0xa, srcA, 1, false), entry(0xb, srcA, 1, true)
		e := withWinner(&event.Event{Kind: event.KindMerged, QID: aaaa, TimeNs: 40, NetNS: node, CT: loser}, winner, a)
		h.handle(e)
		h.handle(e) // seen twice: counted once
		inc := h.only(CauseClashResolved)
		if race(inc) != RaceSameTuple || inc.QType != QType(dns.TypeAAAA) || inc.Winner == nil || inc.Winner.QType != QType(dns.TypeA) {
			t.Errorf("incident %+v winner %+v", inc, inc.Winner)
		}
		if h.c.Attributed()[node].ClashResolve != 1 {
			t.Errorf("attributed %+v", h.c.Attributed()[node])
		}
	})
	t.Run("same entry address and tuple, later", func(t *testing.T) {
		// The slab gives the freed loser's address to the next entry,
		// and a new socket can get the same port: a second loser with
		// the same key, seconds later (make vmtest, 5.10: kernel
		// clash_resolve 91, attributed 90).
		h := newHarness(t, nil)
		for i, t0 := range []uint64{0, 2 * uint64(time.Second)} {
			a := h.query(t0, podA, srcA, uint16(2*i+1), dns.TypeA)
			aaaa := h.query(t0+1, podA, srcA, uint16(2*i+2), dns.TypeAAAA)
			e := withWinner(&event.Event{Kind: event.KindMerged, QID: aaaa, TimeNs: t0 + 40, NetNS: node, CT: entry(0xa, srcA, 1, false)},
				entry(0xb, srcA, 1, true), a)
			h.handle(e)
			h.handle(e)
			h.answer(t0+50, a)
			h.answer(t0+50, aaaa)
		}
		if n := h.c.Attributed()[node].ClashResolve; n != 2 || len(h.incidents) != 2 {
			t.Errorf("attributed %d, %d incidents; want 2 losers", n, len(h.incidents))
		}
	})
	t.Run("read before its query", func(t *testing.T) {
		// A copy on another CPU found the flow the query's first packet
		// had just made and wrote its record before that packet's own.
		h := newHarness(t, nil)
		a := h.query(0, podA, srcA, 1, dns.TypeA)
		aaaa := h.qid + 1
		h.handle(withWinner(&event.Event{Kind: event.KindMerged, QID: aaaa, TimeNs: 2, NetNS: node, CT: entry(0xa, srcA, 1, false)},
			entry(0xb, srcA, 1, true), a))
		if got := h.query(3, podA, srcA, 2, dns.TypeAAAA); got != aaaa {
			t.Fatalf("query %d, want %d", got, aaaa)
		}
		h.c.Tick(400 * ms)
		if inc := h.only(CauseClashResolved); race(inc) != RaceSameTuple || inc.QType != QType(dns.TypeAAAA) {
			t.Errorf("incident %+v", inc)
		}
		if n := h.c.Attributed()[node].ClashResolve; n != 1 {
			t.Errorf("attributed %d, want 1", n)
		}
	})
	t.Run("counted by the caller before its cutoff", func(t *testing.T) {
		// A namespace watched late: the races of queries sent before the
		// counter was read are the counter's; they are still reported.
		h := newHarness(t, nil)
		h.c.CountRescuesFrom(node, 100)
		for i, t0 := range []uint64{0, 200} {
			a := h.query(t0, podA, srcA, uint16(2*i+1), dns.TypeA)
			aaaa := h.query(t0+1, podA, srcA, uint16(2*i+2), dns.TypeAAAA)
			h.handle(withWinner(&event.Event{Kind: event.KindMerged, QID: aaaa, TimeNs: t0 + 40, NetNS: node,
				CT: entry(uint64(0xa+i), srcA, 1, false)}, entry(0xb, srcA, 1, true), a))
		}
		if n := h.c.Attributed()[node].ClashResolve; n != 1 || len(h.incidents) != 2 {
			t.Errorf("attributed %d, %d incidents; want 1 of 2", n, len(h.incidents))
		}
	})
	t.Run("NAT_CLASH", func(t *testing.T) {
		h := newHarness(t, nil)
		h.query(0, podA, srcA, 1, dns.TypeA)
		aaaa := h.query(1, podA, srcA, 2, dns.TypeAAAA)
		h.handle(&event.Event{Kind: event.KindNATClash, QID: aaaa, TimeNs: 40, NetNS: node, CT: entry(0xa, srcA, 1, true)})
		if inc := h.only(CauseClashResolved); race(inc) != RaceSameTuple || inc.Winner != nil {
			t.Errorf("incident %+v", inc)
		}
	})
	t.Run("freed unconfirmed entry, tracepoint", func(t *testing.T) {
		h := newHarness(t, nil)
		h.query(0, podA, srcA, 1, dns.TypeA)
		h.handle(&event.Event{Kind: event.KindCTFreed, TimeNs: 5, NetNS: node, CT: entry(0xa, srcA, 1, false)})
		h.query(6, podA, srcA, 2, dns.TypeAAAA) // the loser leaves after its entry was freed
		h.c.Tick(400 * ms)
		if inc := h.only(CauseClashResolved); inc.QType != QType(dns.TypeAAAA) || inc.NodeNetNS != node {
			t.Errorf("incident %+v", inc)
		}
	})
}

// A query first seen where its answer cannot be seen (forwarded from
// outside, function tier) is never declared lost for want of an answer.
func TestUnwatchedQuery(t *testing.T) {
	h := newHarness(t, nil)
	h.qid++
	e := &event.Event{Kind: event.KindQuery, QID: h.qid, NetNS: node, Flags: event.FlagNoSocket,
		Packet: event.Tuple{Src: srcA, Dst: vip, Proto: 17}}
	e.DNS.Valid, e.DNS.ID, e.DNS.QType = true, 1, dns.TypeA
	e.DNS.SetQName("svc-00.lab.test")
	h.handle(e)
	h.answer(5*uint64(time.Second), h.query(5*uint64(time.Second), node, srcA, 1, dns.TypeA))
	h.c.Tick(20 * uint64(time.Second))
	h.c.Close(21 * uint64(time.Second))
	if len(h.incidents) != 0 {
		t.Errorf("incidents %+v", h.incidents)
	}
}

// A stall without a retry closes after QueryTTL, not retried.
func TestStallWithoutRetry(t *testing.T) {
	h := newHarness(t, fakeCounters{node: {InsertFailed: 1, Drop: 1}})
	a := h.query(0, podA, srcA, 1, dns.TypeA)
	h.handle(drop(10, a, reasonNetfilter, 1, entry(0xa, srcA, 1, false)))
	h.c.Tick(400 * ms)
	h.c.Tick(13 * uint64(time.Second))
	inc := h.only(CauseInsertRace)
	if inc.Retried || inc.StallMs != nil || inc.Retry != nil {
		t.Errorf("incident %+v", inc)
	}
}

// A stall that opens already past QueryTTL (an unanswered query declared
// lost at its TTL) is reported MinRetryGap later, though a younger stall is in
// progress: expire walks the stalls once the earliest start may be past
// the TTL, and the new stall's start is the earliest.
func TestStallOpenedPastTTLCloses(t *testing.T) {
	h := newHarness(t, fakeCounters{node: {InsertFailed: 1, Drop: 1}})
	sec := uint64(time.Second)
	h.query(2*sec, podB, srcB, 7, dns.TypeA) // never answered
	a := h.query(5*sec, podA, srcA, 1, dns.TypeA)
	h.handle(drop(5*sec+10, a, reasonNetfilter, 1, entry(0xa, srcA, 1, false)))
	h.c.Tick(6 * sec) // the drop's stall, from 5 s, is in progress
	if len(h.incidents) != 0 {
		t.Fatalf("incidents before any TTL: %+v", h.incidents)
	}
	h.c.Tick(14*sec + 1)                           // podB's query is lost: a stall from 2 s, past its TTL
	h.c.Tick(14*sec + uint64(h.c.cfg.MinRetryGap)) // and over: no other query of its attempt came
	if len(h.incidents) != 1 || h.incidents[0].Cause != CauseNoReply || h.incidents[0].NetNS != podB {
		t.Fatalf("at 14 s: %+v, want podB's no_reply", h.incidents)
	}
	h.c.Tick(17*sec + uint64(h.c.cfg.MinRetryGap) + 1)
	if len(h.incidents) != 2 || h.incidents[1].Cause != CauseInsertRace {
		t.Fatalf("at 17 s: %+v, want podA's insert_race too", h.incidents)
	}
}

// At Close, only queries that waited a whole resolver timeout are lost.
func TestCloseLosesOnlyTimedOut(t *testing.T) {
	h := newHarness(t, nil)
	h.query(0, podA, srcA, 1, dns.TypeA)
	h.query(4*uint64(time.Second), podB, srcB, 2, dns.TypeA)
	h.c.Close(6 * uint64(time.Second))
	if inc := h.only(CauseNoReply); inc.NetNS != podA {
		t.Errorf("incident %+v", inc)
	}
}

// Past MaxQueries the oldest are evicted and counted; a drop of an evicted
// query is ignored even if its struct was reused.
func TestEviction(t *testing.T) {
	h := newHarness(t, fakeCounters{node: {InsertFailed: 1, Drop: 1}})
	h.c.cfg.MaxQueries = 4
	first := h.query(0, podA, srcA, 1, dns.TypeA)
	for i := range 8 {
		h.query(uint64(i+1), podB, netip.AddrPortFrom(srcB.Addr(), uint16(5000+i)), uint16(10+i), dns.TypeA)
	}
	h.handle(drop(20, first, reasonNetfilter, 1, entry(0xa, srcA, 1, false)))
	h.c.Tick(400 * ms)
	if st := h.c.Stats(); st.Evicted != 5 || st.Queries != 9 || st.InFlight != 4 {
		t.Errorf("stats %+v", st)
	}
	h.c.Close(uint64(time.Second))
	if len(h.incidents) != 0 {
		t.Errorf("incidents %+v", h.incidents)
	}
}

// Past MaxStalls the oldest stall in progress is reported at once, as not
// retried, and counted; none is lost, and memory holds MaxStalls at most.
func TestStallCap(t *testing.T) {
	h := newHarness(t, nil)
	h.c.cfg.MaxStalls = 3
	for i := range 5 {
		q := h.query(uint64(i), uint32(100+i), srcA, uint16(i+1), dns.TypeA)
		h.handle(drop(uint64(10+i), q, reasonNetfilter, 1, event.CT{}))
	}
	h.c.Tick(400 * ms)
	if st := h.c.Stats(); st.StallsReportedEarly != 2 || h.c.stalls.len() != 3 {
		t.Errorf("stats %+v, %d stalls in progress; want 2 reported early, 3 in progress", st, h.c.stalls.len())
	}
	if len(h.incidents) != 2 || h.incidents[0].NetNS != 100 || h.incidents[1].NetNS != 101 {
		t.Fatalf("incidents before the cap's are %+v, want the two oldest stalls", h.incidents)
	}
	for _, inc := range h.incidents {
		if inc.Cause != CauseRuleDrop || inc.Retried || inc.StallMs != nil || len(inc.Lost) != 1 {
			t.Errorf("reported early: %+v", inc)
		}
	}
	h.c.Close(uint64(time.Second))
	if len(h.incidents) != 5 || h.c.stalls.len() != 0 {
		t.Errorf("%d incidents after Close, want 5; %d in progress", len(h.incidents), h.c.stalls.len())
	}
}

// The log of stalls by opening lets go of the ones their retries closed.
func TestStallLogShrinks(t *testing.T) {
	h := newHarness(t, nil)
	const n = 1500
	for i := range n {
		q := h.query(0, uint32(1000+i), srcA, uint16(i), dns.TypeA)
		h.handle(drop(10, q, reasonNetfilter, 1, event.CT{}))
	}
	h.c.Tick(400 * ms)
	for i := range n {
		// another id: not a resend, so the query ends the stall at once
		h.query(5*uint64(time.Second), uint32(1000+i), srcA, uint16(i+1), dns.TypeA)
	}
	if len(h.incidents) != n || h.c.stalls.len() != 0 || h.c.stallLog.len() != n {
		t.Fatalf("%d incidents, %d stalls open, %d in the log; want %d, 0, %d", len(h.incidents), h.c.stalls.len(), h.c.stallLog.len(), n, n)
	}
	h.c.Tick(5*uint64(time.Second) + 1)
	if l := h.c.stallLog.len(); l != 0 {
		t.Errorf("%d closed stalls still in the log", l)
	}
}

// An open stall keeps its queries alive even when they expire: their
// structs are reused only after the incident is written.
func TestOpenStallHoldsItsQueries(t *testing.T) {
	h := newHarness(t, fakeCounters{node: {InsertFailed: 1, Drop: 1}})
	h.c.cfg.MaxQueries = 2
	a := h.query(0, podA, srcA, 1, dns.TypeA)
	h.handle(drop(10, a, reasonNetfilter, 1, entry(0xa, srcA, 1, false)))
	h.c.Tick(400 * ms)
	for i := range 6 { // evicts a, reuses structs
		h.query(uint64(500+i)*ms, podB, netip.AddrPortFrom(srcB.Addr(), uint16(5000+i)), uint16(10+i), dns.TypeA)
	}
	h.retried(5*uint64(time.Second), podA, srcA, 1, dns.TypeA)
	inc := h.only(CauseInsertRace)
	if inc.QName != "svc-00.lab.test" || inc.NetNS != podA || inc.Src != srcA || !inc.Retried {
		t.Errorf("incident %+v", inc)
	}
}

// The writers' description of a drop, with and without a reason (5.10)
// and a location.
func TestDropSite(t *testing.T) {
	for _, c := range []struct {
		p    Packet
		want string
	}{
		{Packet{Reason: "NETFILTER_DROP", Location: "nf_hook_slow+0x7d", NetNS: 7}, "NETFILTER_DROP at nf_hook_slow+0x7d in netns 7"},
		{Packet{Location: "nf_hook_slow+0x93", NetNS: 7}, "at nf_hook_slow+0x93 in netns 7"},
		{Packet{Reason: "NO_SOCKET", NetNS: 7}, "NO_SOCKET in netns 7"},
	} {
		if got := c.p.DropSite(); got != c.want || !c.p.Dropped() {
			t.Errorf("%+v: DropSite %q (dropped %v), want %q", c.p, got, c.p.Dropped(), c.want)
		}
	}
	if (&Packet{NetNS: 7}).Dropped() {
		t.Error("a packet without reason or location counts as dropped")
	}
}

// A query joins its name's list of unanswered ones only once it is
// MinRetryGap old (index.promote): a retry exactly MinRetryGap after it
// still finds it, a query answered before that never makes a name state,
// and a young query evicted meanwhile (its struct recycled for the next
// query) is not taken for lost.
func TestYoungQueriesJoinTheirNameLate(t *testing.T) {
	h := newHarness(t, nil)
	gap := uint64(h.c.cfg.MinRetryGap)
	lost := h.query(0, podA, srcA, 1, dns.TypeA)
	answered := h.query(10, podB, srcB, 2, dns.TypeA)
	h.answer(20, answered)
	if n := h.c.ix.names.len(); n != 0 {
		t.Errorf("%d name states before any query is MinRetryGap old, want 0", n)
	}
	h.query(gap-1, podA, srcA, 3, dns.TypeA) // too early to be a retry
	if st := h.c.Stats(); st.Lost != 0 {
		t.Fatalf("a query %d ns after another was taken for its retry: %+v", gap-1, st)
	}
	h.query(gap, podA, srcA, 4, dns.TypeA) // exactly the gap after the first: its retry
	if q := h.c.ix.lookup(lost); q == nil || q.state != stateLost || h.c.Stats().Lost != 1 {
		t.Fatalf("the retry at exactly MinRetryGap did not make the first query lost: %+v %+v", q, h.c.Stats())
	}

	h2 := newHarness(t, nil)
	h2.c.cfg.MaxQueries = 1
	h2.query(0, podA, srcA, 1, dns.TypeA)
	h2.query(1, podB, srcB, 2, dns.TypeA)     // evicts the first
	h2.query(3*gap, podA, srcA, 3, dns.TypeA) // would be its retry
	h2.c.Close(3 * gap)
	if st := h2.c.Stats(); st.Evicted != 2 || st.Lost != 0 || len(h2.incidents) != 0 {
		t.Fatalf("an evicted query was taken for lost: %+v %+v", st, h2.incidents)
	}
}

// A query the kernel's full flow table could not keep (its QUERY record
// says untracked, or the table's sweeper reports it evicted, before or after
// that record) has no answer to wait for: never a loss, counted.
func TestUntrackedQueryIsNoLoss(t *testing.T) {
	h := newHarness(t, nil)
	h.qid++
	e := &event.Event{Kind: event.KindQuery, Flags: event.FlagSender | event.FlagUntracked, QID: h.qid, TimeNs: 0, NetNS: podA,
		Packet: event.Tuple{Src: srcA, Dst: vip, Proto: 17}, Tier: event.TierFentry, PID: 4242}
	e.DNS.Valid, e.DNS.ID, e.DNS.QType = true, 1, dns.TypeA
	e.DNS.SetQName("svc-00.lab.test")
	h.handle(e)
	later := h.query(ms, podB, srcB, 2, dns.TypeA)
	h.handle(&event.Event{Kind: event.KindUntracked, QID: later, TimeNs: 2 * ms})
	// reported (by the table's sweeper) before its QUERY record is read
	h.handle(&event.Event{Kind: event.KindUntracked, QID: h.qid + 1})
	h.query(3*ms, podA, srcA, 3, dns.TypeAAAA)
	h.c.Tick(20 * uint64(time.Second))
	h.c.Close(21 * uint64(time.Second))
	if len(h.incidents) != 0 {
		t.Errorf("incidents for untracked queries: %+v", h.incidents)
	}
	if st := h.c.Stats(); st.Untracked != 3 || st.Lost != 0 || st.InFlight != 0 {
		t.Errorf("stats %+v, want 3 untracked, none lost or in flight", st)
	}
}
