package correlate

import (
	"net/netip"
	"testing"

	"github.com/miekg/dns"

	"github.com/dnsrace/dnsrace/internal/event"
)

// A forwarder's socket keeps one port: its entry, made and answered long
// ago, still DNATs the VIP to a backend that is gone.
var (
	fwdSock  = netip.MustParseAddrPort("10.244.0.250:5301")
	goneBE   = netip.MustParseAddrPort("10.244.0.200:53")
	snatSide = netip.MustParseAddrPort("10.244.0.1:5301")
)

func staleEntry(src netip.AddrPort) event.CT {
	return event.CT{Ptr: 0xabc, Status: event.IPSConfirmed | event.IPSSeenReply | event.IPSDstNAT,
		Orig:  event.Tuple{Src: src, Dst: vip, Proto: 17},
		Reply: event.Tuple{Src: goneBE, Dst: snatSide, Proto: 17}}
}

// TestStaleNATByItsDrop: the query is dropped where NAT ran, with the
// entry (answered before it): no route to the gone backend.
func TestStaleNATByItsDrop(t *testing.T) {
	h := newHarness(t, nil)
	h.answer(ms, h.query(0, podA, fwdSock, 1, dns.TypeA))
	q := h.query(2*sec, podA, fwdSock, 2, dns.TypeA)
	h.handle(drop(2*sec+ms, q, reasonOther, 3, staleEntry(fwdSock)))
	h.c.Tick(3 * sec)
	h.retried(7*sec, podA, fwdSock, 2, dns.TypeA)
	inc := h.only(CauseStaleNAT)
	s := inc.StaleNAT
	if s == nil || s.Gone != goneBE || s.Entry.Src != fwdSock || s.Entry.Dst != vip || s.NetNS != node ||
		s.LastAnswerMs == nil || *s.LastAnswerMs != 1999 {
		t.Errorf("stale_nat %+v; want the entry from %s to %s, gone %s, in netns %d, last answered 1999 ms before", s, fwdSock, vip, goneBE, node)
	}
}

// TestStaleNATByACopy: the forwarder's socket has no address of its own
// at send (the function tiers' key), its query leaves on the stale entry,
// and a bridge that does not know the gone backend floods it: the copy
// other pods drop (OTHERHOST) is first seen at its drop, after NAT. It is
// the query's evidence, not a query of its own.
func TestStaleNATByACopy(t *testing.T) {
	h := newHarness(t, nil)
	unbound := netip.AddrPortFrom(netip.IPv4Unspecified(), fwdSock.Port())
	h.answer(ms, h.query(0, podA, unbound, 1, dns.TypeA))
	h.query(2*sec, podA, unbound, 2, dns.TypeA)
	h.qid++
	copyEv := &event.Event{Kind: event.KindQuery, QID: h.qid, TimeNs: 2*sec + ms, NetNS: podB, Flags: event.FlagAtDrop,
		Packet: event.Tuple{Src: snatSide, Dst: goneBE, Proto: 17}, Tier: event.TierTracepoint}
	copyEv.DNS.Valid, copyEv.DNS.ID, copyEv.DNS.QType = true, 2, dns.TypeA
	copyEv.DNS.SetQName("svc-00.lab.test")
	h.handle(copyEv)
	d := drop(2*sec+2*ms, h.qid, reasonOtherhost, 3, event.CT{})
	d.NetNS = podB
	h.handle(d)
	h.c.Tick(3 * sec)
	h.retried(7*sec, podA, unbound, 2, dns.TypeA)
	inc := h.only(CauseStaleNAT)
	if st := h.c.Stats(); st.Queries != 3 {
		t.Errorf("%d queries followed, want 3: the copy is no query of its own", st.Queries)
	}
	if s := inc.StaleNAT; s == nil || s.Gone != goneBE || s.NetNS != 0 || s.LastAnswerMs == nil {
		t.Errorf("stale_nat %+v; want gone %s, its namespace left to find (0), a last answer", s, goneBE)
	}
	if inc.Lost[0].Reason != "OTHERHOST" || inc.Lost[0].NetNS != podB || inc.NodeNetNS == podB {
		t.Errorf("lost %+v, node netns %d; want the copy's OTHERHOST in netns %d, not taken for where NAT ran", inc.Lost, inc.NodeNetNS, podB)
	}
}

// TestStaleNATServerGone: the copy reaches the gone backend's address,
// whose server is gone first (NO_SOCKET; on 5.10, no reason: freed by
// __udp4_lib_rcv), or it reaches the backend's own namespace and is
// dropped there; and the same query dropped by a rule is no stale entry's.
func TestStaleNATServerGone(t *testing.T) {
	for _, c := range []struct {
		name   string
		reason uint32
		loc    uint64
		want   string
	}{
		{"NO_SOCKET", reasonNoSocket, 2, CauseStaleNAT},
		{"5.10, freed by __udp4_lib_rcv", reasonNone, 2, CauseStaleNAT},
		{"5.10, freed by nf_hook_slow", reasonNone, 1, CauseRuleDrop},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.answer(ms, h.query(0, podA, fwdSock, 1, dns.TypeA))
			q := h.query(2*sec, podA, fwdSock, 2, dns.TypeA)
			h.handle(drop(2*sec+ms, q, c.reason, c.loc, staleEntry(fwdSock)))
			h.c.Tick(3 * sec)
			h.retried(7*sec, podA, fwdSock, 2, dns.TypeA)
			inc := h.only(c.want)
			if (inc.StaleNAT != nil) != (c.want == CauseStaleNAT) {
				t.Errorf("stale entry %+v for cause %s", inc.StaleNAT, inc.Cause)
			}
		})
	}
}

// TestLastAnswerSurvivesPodSockets: a forwarder's socket, answered again
// and again, keeps its last answer while a node's pods answer thousands of
// one-shot sockets (in a table of 8,192 slots, one-shot sockets alone
// would overwrite a given slot within some thousands of answers).
func TestLastAnswerSurvivesPodSockets(t *testing.T) {
	c := New(Config{})
	fwd := &query{sock: sockOf(fwdSock, netip.MustParseAddrPort("10.96.0.10:53"))}
	now := uint64(1e9)
	for range 3 {
		now += 1e6
		c.noteAnswer(fwd, now)
	}
	forwarderLast := now
	for i := range 100_000 {
		pod := &query{sock: sockOf(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 16), byte(i >> 8)}), uint16(i)),
			netip.MustParseAddrPort("10.244.0.250:53"))}
		now += 1e5
		c.noteAnswer(pod, now)
	}
	if a := c.lastAnswerOf(fwd.sock); a == nil || a.atNs != forwarderLast {
		t.Fatalf("the forwarder's last answer after 100,000 pod sockets: %+v, want at %d", a, forwarderLast)
	}
	// A socket silent for longer than lastAnswerKeep gives its slot up.
	now += lastAnswerKeep + 1
	for i := range 100_000 {
		pod := &query{sock: sockOf(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 245, byte(i >> 16), byte(i >> 8)}), uint16(i)),
			netip.MustParseAddrPort("10.244.0.250:53"))}
		now += 1e5
		c.noteAnswer(pod, now)
	}
	if a := c.lastAnswerOf(fwd.sock); a != nil {
		t.Errorf("a socket silent for %v still holds its slot", lastAnswerKeep)
	}
}
