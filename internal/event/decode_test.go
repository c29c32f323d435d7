package event

import (
	"bytes"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/dnsrace/dnsrace/internal/bpf"
	"github.com/miekg/dns"
)

type rawTuple = struct {
	_      [0]byte
	Saddr  [16]uint8
	Daddr  [16]uint8
	Sport  uint16
	Dport  uint16
	Family uint8
	Proto  uint8
	Pad    [2]uint8
}

func bytesOf[T any](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

// queryRecord is a raw QUERY record: the generated fixed part, then msg.
func queryRecord(q *bpf.DnsraceRecQuery, msg []byte) []byte {
	q.H.Type = uint8(bpf.DnsraceRecTypeREC_QUERY)
	q.DnsLen = uint16(len(msg))
	return append(append([]byte{}, bytesOf(q)...), msg...)
}

// eventRecord is a raw EVENT record: the generated fixed part, then msg.
func eventRecord(ev *bpf.DnsraceRecEvent, msg []byte) []byte {
	ev.H.Type = uint8(bpf.DnsraceRecTypeREC_EVENT)
	ev.DnsLen = uint16(len(msg))
	return append(append([]byte{}, bytesOf(ev)...), msg...)
}

// TestLayout pins Decode's offsets to the bpf2go-generated records.
func TestLayout(t *testing.T) {
	var q bpf.DnsraceRecQuery
	var a bpf.DnsraceRecAnswer
	var ev bpf.DnsraceRecEvent
	checks := []struct {
		name      string
		got, want uintptr
	}{
		{"hdr size", unsafe.Sizeof(q.H), HdrSize},
		{"ts", unsafe.Offsetof(q.H.Ts), offTS},
		{"qid", unsafe.Offsetof(q.H.Qid), offQID},
		{"netns", unsafe.Offsetof(q.H.Netns), offNetNS},
		{"cpu", unsafe.Offsetof(q.H.Cpu), offCPU},
		{"type", unsafe.Offsetof(q.H.Type), offType},
		{"tier", unsafe.Offsetof(q.H.Tier), offTier},

		{"query size", unsafe.Sizeof(q), QuerySize},
		{"query cgroup", unsafe.Offsetof(q.Cgroup), offQCgroup},
		{"query pid", unsafe.Offsetof(q.Pid), offQPID},
		{"query dns_len", unsafe.Offsetof(q.DnsLen), offQDNSLen},
		{"query flags", unsafe.Offsetof(q.Flags), offQFlags},
		{"query comm", unsafe.Offsetof(q.Comm), offQComm},
		{"query tuple", unsafe.Offsetof(q.T), offQTuple},

		{"answer size", unsafe.Sizeof(a), AnswerSize},
		{"answer dns_flags", unsafe.Offsetof(a.DnsFlags), offADNSFlags},

		{"event size", unsafe.Sizeof(ev), EventSize},
		{"event location", unsafe.Offsetof(ev.Location), offELocation},
		{"event winner_qid", unsafe.Offsetof(ev.WinnerQid), offEWinnerQID},
		{"event reason", unsafe.Offsetof(ev.Reason), offEReason},
		{"event dns_len", unsafe.Offsetof(ev.DnsLen), offEDNSLen},
		{"event kind", unsafe.Offsetof(ev.Kind), offEKind},
		{"event flags", unsafe.Offsetof(ev.Flags), offEFlags},
		{"event pkt", unsafe.Offsetof(ev.Pkt), offEPkt},
		{"event ct", unsafe.Offsetof(ev.Ct), offECT},
		{"event winner", unsafe.Offsetof(ev.Winner), offEWinner},

		{"tuple size", unsafe.Sizeof(ev.Pkt), tupleSize},
		{"tuple sport", unsafe.Offsetof(ev.Pkt.Sport), tupSport},
		{"tuple dport", unsafe.Offsetof(ev.Pkt.Dport), tupDport},
		{"tuple family", unsafe.Offsetof(ev.Pkt.Family), tupFamily},
		{"tuple proto", unsafe.Offsetof(ev.Pkt.Proto), tupProto},
		{"ct size", unsafe.Sizeof(ev.Ct), ctSize},
		{"ct status", unsafe.Offsetof(ev.Ct.Status), ctStatus},
		{"ct orig", unsafe.Offsetof(ev.Ct.Orig), ctOrig},
		{"ct reply", unsafe.Offsetof(ev.Ct.Reply), ctReply},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: generated %d, decode.go %d", c.name, c.got, c.want)
		}
	}
}

// TestEnumValues pins the Go constants to the C enums.
func TestEnumValues(t *testing.T) {
	types := map[bpf.DnsraceRecType]uint8{
		bpf.DnsraceRecTypeREC_QUERY: recQuery, bpf.DnsraceRecTypeREC_ANSWER: recAnswer, bpf.DnsraceRecTypeREC_EVENT: recEvent,
	}
	for c, g := range types {
		if uint32(c) != uint32(g) {
			t.Errorf("C record type %d is Go %d", c, g)
		}
	}
	kinds := map[bpf.DnsraceEvKind]Kind{
		bpf.DnsraceEvKindEV_DROP: KindDrop, bpf.DnsraceEvKindEV_CONFIRM_DROP: KindConfirmDrop,
		bpf.DnsraceEvKindEV_MERGED: KindMerged, bpf.DnsraceEvKindEV_NAT_CLASH: KindNATClash,
		bpf.DnsraceEvKindEV_CT_FREED: KindCTFreed, bpf.DnsraceEvKindEV_WINNER: KindWinner,
		bpf.DnsraceEvKindEV_RCVBUF_FULL: KindRcvbufFull, bpf.DnsraceEvKindEV_CT_NETNS: KindCTNetNS,
		bpf.DnsraceEvKindEV_UNTRACKED: KindUntracked,
	}
	for c, g := range kinds {
		var ev bpf.DnsraceRecEvent
		ev.Kind = uint8(c)
		var e Event
		if err := Decode(eventRecord(&ev, nil), &e); err != nil || e.Kind != g {
			t.Errorf("C kind %d decodes to %v (%v), want %v", c, e.Kind, err, g)
		}
	}
	if len(kinds)+int(KindDrop) != int(kindMax) {
		t.Errorf("C has %d event kinds, Go %d", len(kinds), int(kindMax)-int(KindDrop))
	}
	tiers := map[bpf.DnsraceTier]Tier{
		bpf.DnsraceTierTIER_NONE: TierNone, bpf.DnsraceTierTIER_TRACEPOINT: TierTracepoint,
		bpf.DnsraceTierTIER_KPROBE: TierKprobe, bpf.DnsraceTierTIER_FENTRY: TierFentry,
	}
	for c, g := range tiers {
		if uint32(c) != uint32(g) {
			t.Errorf("C tier %d is Go tier %v (%d)", c, g, g)
		}
	}
	flags := map[bpf.DnsraceRecFlags]int{
		bpf.DnsraceRecFlagsRF_NO_SOCKET: FlagNoSocket, bpf.DnsraceRecFlagsRF_RESPONSE: FlagResponse,
		bpf.DnsraceRecFlagsRF_WINNER: FlagWinner,
		bpf.DnsraceRecFlagsRF_SENDER: FlagSender, bpf.DnsraceRecFlagsRF_AT_DROP: FlagAtDrop,
		bpf.DnsraceRecFlagsRF_UNTRACKED: FlagUntracked,
	}
	for c, g := range flags {
		if int(c) != g {
			t.Errorf("C flag %d is Go %d", c, g)
		}
	}
	stats := map[bpf.DnsraceStatIndex]int{
		bpf.DnsraceStatIndexSTAT_RING_LOST: StatRingLost, bpf.DnsraceStatIndexSTAT_FLOWS_NEW: StatFlowsNew,
		bpf.DnsraceStatIndexSTAT_FLOWS_ANSWERED: StatFlowsAnswered, bpf.DnsraceStatIndexSTAT_FLOWS_REFUSED: StatFlowsRefused,
		bpf.DnsraceStatIndexSTAT_MAX: StatMax,
	}
	for c, g := range stats {
		if int(c) != g {
			t.Errorf("C stat %d is Go %d", c, g)
		}
	}
}

func query(t testing.TB, name string, qtype uint16) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.Id = 0x1234
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func v4Tuple(src, dst string, sport, dport uint16) (tp rawTuple) {
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(tp.Saddr[:], s[:])
	copy(tp.Daddr[:], d[:])
	tp.Sport, tp.Dport, tp.Family, tp.Proto = sport, dport, 4, 17
	return tp
}

func TestDecodeQuery(t *testing.T) {
	var q bpf.DnsraceRecQuery
	q.H.Ts, q.H.Qid, q.H.Netns, q.H.Cpu, q.H.Tier = 111, 1<<48|7, 4026531840, 1, uint8(TierFentry)
	q.Cgroup, q.Pid, q.Flags = 77, 4242, FlagNoSocket
	copy(q.Comm[:], "getent")
	tp := v4Tuple("10.0.0.1", "10.96.0.10", 40000, 53)
	q.T.Saddr, q.T.Daddr, q.T.Sport, q.T.Dport, q.T.Family, q.T.Proto = tp.Saddr, tp.Daddr, tp.Sport, tp.Dport, tp.Family, tp.Proto

	var e Event
	if err := Decode(queryRecord(&q, query(t, "kubernetes.default.svc.cluster.local.", dns.TypeAAAA)), &e); err != nil {
		t.Fatal(err)
	}
	if e.Kind != KindQuery || e.Tier != TierFentry || e.TimeNs != 111 || e.QID != 1<<48|7 ||
		e.NetNS != 4026531840 || e.PID != 4242 || e.CPU != 1 || e.Cgroup != 77 || e.Flags != FlagNoSocket {
		t.Errorf("scalars: %+v", e)
	}
	if CommString(e.Comm) != "getent" {
		t.Errorf("comm %q", CommString(e.Comm))
	}
	if got := e.Packet.String(); got != "10.0.0.1:40000->10.96.0.10:53" || e.Packet.Proto != 17 {
		t.Errorf("packet %s proto %d", got, e.Packet.Proto)
	}
	d := e.DNS
	if !d.Valid || d.ID != 0x1234 || d.Response || d.QType != dns.TypeAAAA || d.NameTruncated ||
		d.QName() != "kubernetes.default.svc.cluster.local" {
		t.Errorf("dns %+v name %q", d, d.QName())
	}
}

func TestDecodeAnswer(t *testing.T) {
	var a bpf.DnsraceRecAnswer
	a.H.Type, a.H.Qid, a.H.Netns = uint8(bpf.DnsraceRecTypeREC_ANSWER), 9, 5
	a.DnsFlags = 0x8183 // response, NXDOMAIN
	var e Event
	if err := Decode(bytesOf(&a), &e); err != nil {
		t.Fatal(err)
	}
	if e.Kind != KindAnswer || e.QID != 9 || e.NetNS != 5 || !e.Response() || !e.DNS.Response || e.DNS.Rcode != dns.RcodeNameError {
		t.Errorf("answer %+v", e)
	}
}

func TestDecodeDropOfUnmatchedAnswer(t *testing.T) {
	var ev bpf.DnsraceRecEvent
	ev.Kind, ev.Flags = uint8(bpf.DnsraceEvKindEV_DROP), FlagResponse|FlagWinner
	ev.Location, ev.Reason, ev.WinnerQid = 0xffffffff81234567, 77, 12
	s, d := netip.MustParseAddr("fd00::53"), netip.MustParseAddr("fd00::1")
	ev.Pkt.Saddr, ev.Pkt.Daddr = s.As16(), d.As16()
	ev.Pkt.Sport, ev.Pkt.Dport, ev.Pkt.Family, ev.Pkt.Proto = 53, 5353, 6, 17
	ev.Ct.Ptr, ev.Ct.Status = 0xffff8888aaaa0000, IPSDstNAT
	tp := v4Tuple("10.0.0.1", "10.96.0.10", 40000, 53)
	ev.Ct.Orig.Saddr, ev.Ct.Orig.Daddr, ev.Ct.Orig.Sport, ev.Ct.Orig.Dport, ev.Ct.Orig.Family, ev.Ct.Orig.Proto =
		tp.Saddr, tp.Daddr, tp.Sport, tp.Dport, tp.Family, tp.Proto
	rp := v4Tuple("10.244.1.5", "10.0.0.1", 53, 40000)
	ev.Winner.Ptr, ev.Winner.Status = 0xffff8888bbbb0000, IPSConfirmed
	ev.Winner.Reply.Saddr, ev.Winner.Reply.Daddr, ev.Winner.Reply.Sport, ev.Winner.Reply.Dport, ev.Winner.Reply.Family, ev.Winner.Reply.Proto =
		rp.Saddr, rp.Daddr, rp.Sport, rp.Dport, rp.Family, rp.Proto
	m := new(dns.Msg)
	m.SetQuestion("example.org.", dns.TypeA)
	m.Response, m.Rcode, m.Id = true, dns.RcodeNameError, 7
	b, _ := m.Pack()

	var e Event
	if err := Decode(eventRecord(&ev, b), &e); err != nil {
		t.Fatal(err)
	}
	if e.Kind != KindDrop || e.Location != 0xffffffff81234567 || e.Reason != 77 || e.WinnerQID != 12 || !e.Response() {
		t.Errorf("scalars %+v", e)
	}
	if e.Packet.String() != "[fd00::53]:53->[fd00::1]:5353" {
		t.Errorf("packet %s", e.Packet)
	}
	if e.CT.Ptr != 0xffff8888aaaa0000 || e.CT.Status != IPSDstNAT || e.CT.Confirmed() || e.CT.Orig.String() != "10.0.0.1:40000->10.96.0.10:53" {
		t.Errorf("ct %+v", e.CT)
	}
	if !e.Winner.Confirmed() || e.Winner.Reply.String() != "10.244.1.5:53->10.0.0.1:40000" || e.Winner.Orig.IsValid() {
		t.Errorf("winner %+v", e.Winner)
	}
	if !e.DNS.Valid || !e.DNS.Response || e.DNS.Rcode != dns.RcodeNameError || e.DNS.ID != 7 ||
		e.DNS.QName() != "example.org" || e.DNS.QType != dns.TypeA {
		t.Errorf("dns %+v %q", e.DNS, e.DNS.QName())
	}
}

// TestDecodeShortEvents: an event without a DNS message is sent without
// the entries it does not carry, and only then.
func TestDecodeShortEvents(t *testing.T) {
	var ev bpf.DnsraceRecEvent
	ev.Kind, ev.Reason = uint8(bpf.DnsraceEvKindEV_RCVBUF_FULL), 3
	tp := v4Tuple("10.0.0.1", "10.0.0.53", 40000, 53)
	ev.Pkt.Saddr, ev.Pkt.Daddr, ev.Pkt.Sport, ev.Pkt.Dport, ev.Pkt.Family, ev.Pkt.Proto =
		tp.Saddr, tp.Daddr, tp.Sport, tp.Dport, tp.Family, tp.Proto
	ev.Ct.Ptr, ev.Ct.Status = 0xffff8888aaaa0000, IPSConfirmed
	ev.Ct.Orig = ev.Pkt
	full := eventRecord(&ev, nil)

	var e Event
	if err := Decode(full[:EventNoWinnerSize], &e); err != nil {
		t.Fatal(err)
	}
	if e.Kind != KindRcvbufFull || e.Reason != 3 || e.Packet.String() != "10.0.0.1:40000->10.0.0.53:53" ||
		e.CT.Ptr != 0xffff8888aaaa0000 || !e.CT.Confirmed() || e.CT.Orig != e.Packet || e.Winner != (CT{}) {
		t.Errorf("without winner: %+v", e)
	}
	if err := Decode(full[:EventNoCTSize], &e); err != nil {
		t.Fatal(err)
	}
	if e.Kind != KindRcvbufFull || e.Packet.String() != "10.0.0.1:40000->10.0.0.53:53" || e.CT != (CT{}) {
		t.Errorf("without entries: %+v", e)
	}

	for _, n := range []int{EventNoCTSize - 1, EventNoCTSize + 8, EventNoWinnerSize + 8, EventSize - 1} {
		if err := Decode(full[:n], &e); err != ErrShortRecord {
			t.Errorf("%d bytes: %v", n, err)
		}
	}
	ev.Flags = FlagWinner
	if err := Decode(eventRecord(&ev, nil)[:EventNoWinnerSize], &e); err != ErrShortRecord {
		t.Errorf("winner flag without the winner: %v", err)
	}
	ev.Flags = 0
	rec := eventRecord(&ev, nil)
	rec[offEDNSLen] = 12
	if err := Decode(rec[:EventNoWinnerSize], &e); err != ErrShortRecord {
		t.Errorf("DNS length without the message: %v", err)
	}
}

func TestDecodeNames(t *testing.T) {
	long := bytes.Repeat([]byte("a"), 60)
	longName := string(long) + "." + string(long) + "." + string(long) + ".example." // 190 dotted bytes
	lastCut := string(long) + "." + string(long) + ".0123456789."                    // cut inside its last label
	hdr := []byte{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}
	cases := []struct {
		name      string
		msg       []byte
		valid     bool
		qname     string
		qtype     uint16
		truncated bool
	}{
		{"root", append(append([]byte{}, hdr...), 0, 0, 2, 0, 1), true, ".", dns.TypeNS, false},
		{"long name cut at MaxName", query(t, longName, dns.TypeA), true, longName[:MaxName], dns.TypeA, true},
		{"last label cut at MaxName", query(t, lastCut, dns.TypeA), true, lastCut[:MaxName], dns.TypeA, true},
		{"capture ends in name", query(t, "example.com.", dns.TypeA)[:16], true, "exa", 0, true},
		{"capture ends before qtype", query(t, "example.com.", dns.TypeA)[:25], true, "example.com", 0, false},
		{"compression pointer", append(append([]byte{}, hdr...), 3, 'f', 'o', 'o', 0xc0, 0x0c, 0, 1, 0, 1), false, "foo", 0, false},
		{"reserved label type", append(append([]byte{}, hdr...), 0x41, 'x'), false, ".", 0, false},
		{"odd bytes", append(append([]byte{}, hdr...), 3, 'a', '.', 0, 0, 0, 1, 0, 1), true, "a??", 1, false},
		{"short header", hdr[:11], false, ".", 0, false},
		{"no question", []byte{0, 1, 0x81, 0x80, 0, 0, 0, 0, 0, 0, 0, 0}, true, ".", 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var q bpf.DnsraceRecQuery
			var e Event
			if err := Decode(queryRecord(&q, c.msg), &e); err != nil {
				t.Fatal(err)
			}
			d := e.DNS
			if d.Valid != c.valid || d.QName() != c.qname || d.QType != c.qtype || d.NameTruncated != c.truncated {
				t.Errorf("got valid=%v name=%q qtype=%d truncated=%v, want %v %q %d %v",
					d.Valid, d.QName(), d.QType, d.NameTruncated, c.valid, c.qname, c.qtype, c.truncated)
			}
		})
	}
}

// TestNameKey: a decoded name and the same name set with SetQName (the
// correlator's tests and synthetic queries) have one key, however long;
// names the dotted form cannot tell apart (a dot inside a label, shown
// '?') have different keys.
func TestNameKey(t *testing.T) {
	long := strings.Repeat("b", 63)
	for _, name := range []string{".", "a.", "kubernetes.default.svc.cluster.local.",
		strings.Repeat(long+".", 3) + "example."} {
		var q bpf.DnsraceRecQuery
		var e Event
		if err := Decode(queryRecord(&q, query(t, name, dns.TypeA)), &e); err != nil {
			t.Fatal(err)
		}
		var set DNS
		set.SetQName(strings.TrimSuffix(name, "."))
		if !bytes.Equal(e.DNS.NameKey(), set.NameKey()) || len(set.NameKey()) == 0 && name != "." {
			t.Errorf("%q: decoded key %x, SetQName's %x", name, e.DNS.NameKey(), set.NameKey())
		}
		if e.DNS.Name() != set.Name() || set.Name().Cut() {
			t.Errorf("%q: decoded name %q, SetQName's %q (cut %v)", name, e.DNS.Name().Wire(), set.Name().Wire(), set.Name().Cut())
		}
	}
	// Names past MaxName differ after it too.
	var a, b DNS
	a.SetQName(strings.Repeat(long+".", 3) + "a")
	b.SetQName(strings.Repeat(long+".", 3) + "b")
	if bytes.Equal(a.NameKey(), b.NameKey()) || a.Name() == b.Name() {
		t.Errorf("names that differ in byte 193: keys %x %x", a.NameKey(), b.NameKey())
	}
	// A name set after a longer one is the same as set alone, and one the
	// wire form cannot hold is cut.
	a.SetQName("svc.lab")
	b = DNS{}
	b.SetQName("svc.lab")
	if a.Name() != b.Name() || a.Name().Wire() != "\x03svc\x03lab\x00" {
		t.Errorf("svc.lab after a longer name: %q, alone %q", a.Name().Wire(), b.Name().Wire())
	}
	for _, bad := range []string{"a..b", strings.Repeat("b", 64), strings.Repeat(long+".", 4)} {
		b.SetQName(bad)
		if !b.Name().Cut() {
			t.Errorf("SetQName(%q): name %q not cut", bad, b.Name().Wire())
		}
	}
	hdr := []byte{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}
	var one, two DNS
	decodeDNS(append(append([]byte{}, hdr...), 3, 'a', '.', 'b', 0, 0, 1, 0, 1), &one)
	decodeDNS(append(append([]byte{}, hdr...), 3, 'a', '?', 'b', 0, 0, 1, 0, 1), &two)
	if one.QName() != two.QName() || bytes.Equal(one.NameKey(), two.NameKey()) {
		t.Errorf("a label with a dot: names %q %q, keys %x %x", one.QName(), two.QName(), one.NameKey(), two.NameKey())
	}
}

// TestName: Name is the question name's bytes as the message had them,
// the root label included when traced, whatever the bytes; a cut name
// ends where the trace ended, and Labels stops before a label the trace
// cut.
func TestName(t *testing.T) {
	hdr := "\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
	// The longest name a record holds: 255 bytes of labels, the root
	// label, QTYPE and QCLASS end the message at RawDNSCap.
	longest := strings.Repeat("\x3f"+strings.Repeat("x", 63), 3) + "\x3e" + strings.Repeat("y", 62)
	cases := []struct {
		name          string
		msg           string
		wire, labels  string
		cut, valid    bool
		shown         string
		qtype         uint16
		nameTruncated bool
	}{
		{"plain", hdr + "\x03svc\x03lab\x00\x00\x01\x00\x01", "\x03svc\x03lab\x00", "\x03svc\x03lab", false, true, "svc.lab", 1, false},
		{"root", hdr + "\x00\x00\x02\x00\x01", "\x00", "", false, true, ".", 2, false},
		{"odd bytes", hdr + "\x03a.b\x04\x00\xff \\\x00\x00\x01\x00\x01", "\x03a.b\x04\x00\xff \\\x00", "\x03a.b\x04\x00\xff \\", false, true, "a?b.???\\", 1, false},
		{"longest", hdr + longest + "\x00\x00\x1c\x00\x01", longest + "\x00", longest, false, true, strings.Repeat("x", 63) + "." + strings.Repeat("x", 63) + ".", 28, true},
		{"cut inside a label", hdr + "\x07exa", "\x07exa", "", true, true, "exa", 0, true},
		{"cut after a label", hdr + "\x07example", "\x07example", "\x07example", true, true, "example", 0, true},
		{"cut before qtype", hdr + "\x07example\x03com\x00\x00", "\x07example\x03com\x00", "\x07example\x03com", false, true, "example.com", 0, false},
		{"compression pointer", hdr + "\x03foo\xc0\x0c\x00\x01\x00\x01", "\x03foo", "\x03foo", true, false, "foo", 0, false},
		{"no question", "\x00\x01\x81\x80" + strings.Repeat("\x00", 8), "", "", true, true, ".", 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if len(c.msg) > RawDNSCap {
				t.Fatalf("message of %d bytes", len(c.msg))
			}
			var q bpf.DnsraceRecQuery
			var e Event
			if err := Decode(queryRecord(&q, []byte(c.msg)), &e); err != nil {
				t.Fatal(err)
			}
			n := e.DNS.Name()
			if n.Wire() != c.wire || n.Labels() != c.labels || n.Cut() != c.cut || e.DNS.Valid != c.valid {
				t.Errorf("wire %q labels %q cut %v valid %v, want %q %q %v %v", n.Wire(), n.Labels(), n.Cut(), e.DNS.Valid,
					c.wire, c.labels, c.cut, c.valid)
			}
			if n.String() != c.shown || e.DNS.QName() != c.shown || e.DNS.QType != c.qtype || e.DNS.NameTruncated != c.nameTruncated {
				t.Errorf("shown %q (QName %q) qtype %d truncated %v, want %q %d %v", n.String(), e.DNS.QName(),
					e.DNS.QType, e.DNS.NameTruncated, c.shown, c.qtype, c.nameTruncated)
			}
		})
	}
	if (Name{}).Wire() != "" || !(Name{}).Cut() || (Name{}).String() != "." {
		t.Errorf("zero Name: %q cut %v shown %q", Name{}.Wire(), Name{}.Cut(), Name{}.String())
	}
}

func TestDecodeErrors(t *testing.T) {
	var q bpf.DnsraceRecQuery
	raw := queryRecord(&q, query(t, "example.com.", dns.TypeA))
	var e Event
	if err := Decode(raw[:QuerySize-1], &e); err != ErrShortRecord {
		t.Errorf("short query: %v", err)
	}
	if err := Decode(raw[:HdrSize-1], &e); err != ErrShortRecord {
		t.Errorf("short header: %v", err)
	}
	if err := Decode(raw[:len(raw)-1], &e); err != ErrBadLength {
		t.Errorf("dns_len past the record: %v", err)
	}
	for _, typ := range []uint8{0, 4, 200} {
		raw[offType] = typ
		if err := Decode(raw, &e); err != ErrBadKind || e.Kind != KindInvalid {
			t.Errorf("type %d: %v, kind %v", typ, err, e.Kind)
		}
	}
	var ev bpf.DnsraceRecEvent
	for _, k := range []uint8{0, uint8(bpf.DnsraceEvKindEV_UNTRACKED) + 1, 255} {
		ev.Kind = k
		if err := Decode(eventRecord(&ev, nil), &e); err != ErrBadKind {
			t.Errorf("event kind %d: %v", k, err)
		}
	}
	ev.Kind = uint8(bpf.DnsraceEvKindEV_DROP)
	rec := eventRecord(&ev, nil)
	rec[offEDNSLen] = 0xff // more than RawDNSCap
	if err := Decode(rec, &e); err != ErrBadLength {
		t.Errorf("oversized dns_len: %v", err)
	}
}

func BenchmarkDecode(b *testing.B) {
	var q bpf.DnsraceRecQuery
	q.T.Family = 6
	raw := queryRecord(&q, query(b, "kubernetes.default.svc.cluster.local.", dns.TypeAAAA))
	var e Event
	b.ReportAllocs()
	for b.Loop() {
		if err := Decode(raw, &e); err != nil {
			b.Fatal(err)
		}
	}
}

// TestResetZeroesEveryField: reset, which Decode starts with, leaves every
// field of an Event zero but the name's buffers, whatever fields the
// struct gains: each is set here through reflection first.
func TestResetZeroesEveryField(t *testing.T) {
	var e Event
	buffers := map[string]bool{"DNS.wire": true, "DNS.name": true}
	var fill func(v reflect.Value, path string)
	fill = func(v reflect.Value, path string) {
		if v.Kind() == reflect.Struct && v.Type().PkgPath() == reflect.TypeFor[Event]().PkgPath() {
			for i := range v.NumField() {
				f := v.Field(i)
				// unexported fields too: this package's own
				f = reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
				fill(f, strings.TrimPrefix(path+"."+v.Type().Field(i).Name, "."))
			}
			return
		}
		switch v.Kind() {
		case reflect.Bool:
			v.SetBool(true)
		case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			v.SetUint(1)
		case reflect.Array:
			for i := range v.Len() {
				v.Index(i).SetUint(0xff)
			}
		default:
			if v.Type() != reflect.TypeFor[netip.AddrPort]() {
				t.Fatalf("%s: a %v: teach this test to fill it", path, v.Type())
			}
			v.Set(reflect.ValueOf(netip.MustParseAddrPort("10.0.0.1:53")))
		}
		if v.IsZero() {
			t.Fatalf("%s: not filled", path)
		}
	}
	fill(reflect.ValueOf(&e).Elem(), "")
	e.reset()
	var check func(v reflect.Value, path string)
	check = func(v reflect.Value, path string) {
		if v.Kind() == reflect.Struct && v.Type().PkgPath() == reflect.TypeFor[Event]().PkgPath() {
			for i := range v.NumField() {
				check(v.Field(i), strings.TrimPrefix(path+"."+v.Type().Field(i).Name, "."))
			}
			return
		}
		if !buffers[path] && !v.IsZero() {
			t.Errorf("%s: not zeroed by reset", path)
		}
	}
	check(reflect.ValueOf(e), "")
}

// TestDecodeOverDecoded: a record decodes the same into an Event that held
// another record as into a new one (reset leaves the name's buffers as
// they were).
func TestDecodeOverDecoded(t *testing.T) {
	var q bpf.DnsraceRecQuery
	q.T.Family = 4
	long := queryRecord(&q, query(t, "a-rather-long-label.kubernetes.default.svc.cluster.local.", dns.TypeAAAA))
	short := queryRecord(&q, query(t, "svc.", dns.TypeA))
	cut := queryRecord(&q, query(t, "example.com.", dns.TypeA)[:dnsHeaderSz+5])
	var a bpf.DnsraceRecAnswer
	a.H.Type = recAnswer
	answer := append([]byte{}, bytesOf(&a)...)
	var ev bpf.DnsraceRecEvent
	ev.Kind, ev.Flags = uint8(bpf.DnsraceEvKindEV_DROP), FlagResponse|FlagWinner
	ev.Pkt.Family, ev.Ct.Ptr, ev.Ct.Orig.Family, ev.Winner.Ptr = 6, 1, 4, 2
	drop := eventRecord(&ev, query(t, "svc-00.lab.test.", dns.TypeAAAA))
	records := [][]byte{long, short, cut, answer, drop}
	for _, first := range records {
		for _, second := range records {
			var reused, fresh Event
			if err := Decode(first, &reused); err != nil {
				t.Fatal(err)
			}
			_ = reused.DNS.QName() // fills the shown form
			errReused, errFresh := Decode(second, &reused), Decode(second, &fresh)
			if errReused != errFresh {
				t.Fatalf("errors %v and %v", errReused, errFresh)
			}
			if reused.DNS.Name() != fresh.DNS.Name() || reused.DNS.QName() != fresh.DNS.QName() ||
				!bytes.Equal(reused.DNS.NameKey(), fresh.DNS.NameKey()) {
				t.Errorf("name %q / %q, shown %q / %q", reused.DNS.Name().Wire(), fresh.DNS.Name().Wire(),
					reused.DNS.QName(), fresh.DNS.QName())
			}
			reused.DNS.wire, reused.DNS.name = fresh.DNS.wire, fresh.DNS.name
			if reused != fresh {
				t.Errorf("decoded over another record:\n%+v\nalone:\n%+v", reused, fresh)
			}
		}
	}
}
