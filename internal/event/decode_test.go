package event

import (
	"bytes"
	"net/netip"
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

func rawBytes(ev *bpf.DnsraceEvent) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(ev)), unsafe.Sizeof(*ev))
}

// TestLayout pins Decode's offsets to the bpf2go-generated struct event.
func TestLayout(t *testing.T) {
	var ev bpf.DnsraceEvent
	checks := []struct {
		name      string
		got, want uintptr
	}{
		{"size", unsafe.Sizeof(ev), RawSize},
		{"dns cap", unsafe.Sizeof(ev.Dns), RawDNSCap},
		{"ts", unsafe.Offsetof(ev.Ts), offTS},
		{"skb", unsafe.Offsetof(ev.Skb), offSkb},
		{"cgroup", unsafe.Offsetof(ev.Cgroup), offCgroup},
		{"location", unsafe.Offsetof(ev.Location), offLocation},
		{"ct_after", unsafe.Offsetof(ev.CtAfter), offCTAfter},
		{"netns", unsafe.Offsetof(ev.Netns), offNetNS},
		{"ifindex", unsafe.Offsetof(ev.Ifindex), offIfindex},
		{"pid", unsafe.Offsetof(ev.Pid), offPID},
		{"reason", unsafe.Offsetof(ev.Reason), offReason},
		{"verdict", unsafe.Offsetof(ev.Verdict), offVerdict},
		{"cpu", unsafe.Offsetof(ev.Cpu), offCPU},
		{"kind", unsafe.Offsetof(ev.Kind), offKind},
		{"tier", unsafe.Offsetof(ev.Tier), offTier},
		{"comm", unsafe.Offsetof(ev.Comm), offComm},
		{"pkt", unsafe.Offsetof(ev.Pkt), offPkt},
		{"ct", unsafe.Offsetof(ev.Ct), offCT},
		{"winner", unsafe.Offsetof(ev.Winner), offWinner},
		{"dns_len", unsafe.Offsetof(ev.DnsLen), offDNSLen},
		{"dns", unsafe.Offsetof(ev.Dns), offDNS},
		{"tuple size", unsafe.Sizeof(ev.Pkt), tupleSize},
		{"tuple sport", unsafe.Offsetof(ev.Pkt.Sport), tupSport},
		{"tuple dport", unsafe.Offsetof(ev.Pkt.Dport), tupDport},
		{"tuple family", unsafe.Offsetof(ev.Pkt.Family), tupFamily},
		{"tuple proto", unsafe.Offsetof(ev.Pkt.Proto), tupProto},
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

func TestKindTierValues(t *testing.T) {
	kinds := map[bpf.DnsraceKind]Kind{
		bpf.DnsraceKindKIND_INVALID: KindInvalid, bpf.DnsraceKindKIND_SEND: KindSend,
		bpf.DnsraceKindKIND_XMIT: KindXmit, bpf.DnsraceKindKIND_RECV: KindRecv,
		bpf.DnsraceKindKIND_DELIVER: KindDeliver, bpf.DnsraceKindKIND_DROP: KindDrop,
		bpf.DnsraceKindKIND_CONFIRM: KindConfirm, bpf.DnsraceKindKIND_CLASH: KindClash,
		bpf.DnsraceKindKIND_CT_FREE: KindCTFree, bpf.DnsraceKindKIND_RCVBUF_FULL: KindRcvbufFull,
	}
	for c, g := range kinds {
		if uint32(c) != uint32(g) {
			t.Errorf("C kind %d is Go kind %v (%d)", c, g, g)
		}
	}
	if len(kinds) != int(kindMax) {
		t.Errorf("C has %d kinds, Go %d", len(kinds), kindMax)
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

func setDNS(ev *bpf.DnsraceEvent, msg []byte) {
	ev.DnsLen = uint16(copy(ev.Dns[:], msg))
}

func v4Tuple(src, dst string, sport, dport uint16) (tp rawTuple) {
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(tp.Saddr[:], s[:])
	copy(tp.Daddr[:], d[:])
	tp.Sport, tp.Dport, tp.Family, tp.Proto = sport, dport, 4, 17
	return tp
}

func TestDecodeIPv4Query(t *testing.T) {
	var ev bpf.DnsraceEvent
	ev.Ts, ev.Skb, ev.Cgroup = 111, 0xffff888812345678, 77
	ev.Netns, ev.Ifindex, ev.Pid, ev.Verdict, ev.Cpu = 4026531840, 3, 4242, -1, 1
	ev.Kind, ev.Tier = uint8(KindXmit), uint8(TierTracepoint)
	copy(ev.Comm[:], "getent")
	tp := v4Tuple("10.0.0.1", "10.96.0.10", 40000, 53)
	ev.Pkt.Saddr, ev.Pkt.Daddr, ev.Pkt.Sport, ev.Pkt.Dport, ev.Pkt.Family, ev.Pkt.Proto =
		tp.Saddr, tp.Daddr, tp.Sport, tp.Dport, tp.Family, tp.Proto
	ev.Ct.Ptr, ev.Ct.Status = 0xffff8888aaaa0000, IPSDstNAT
	ev.Ct.Orig.Saddr, ev.Ct.Orig.Daddr, ev.Ct.Orig.Sport, ev.Ct.Orig.Dport, ev.Ct.Orig.Family, ev.Ct.Orig.Proto =
		tp.Saddr, tp.Daddr, tp.Sport, tp.Dport, tp.Family, tp.Proto
	rp := v4Tuple("10.244.1.5", "10.0.0.1", 53, 40000)
	ev.Ct.Reply.Saddr, ev.Ct.Reply.Daddr, ev.Ct.Reply.Sport, ev.Ct.Reply.Dport, ev.Ct.Reply.Family, ev.Ct.Reply.Proto =
		rp.Saddr, rp.Daddr, rp.Sport, rp.Dport, rp.Family, rp.Proto
	setDNS(&ev, query(t, "kubernetes.default.svc.cluster.local.", dns.TypeAAAA))

	var e Event
	if err := Decode(rawBytes(&ev), &e); err != nil {
		t.Fatal(err)
	}
	if e.Kind != KindXmit || e.Tier != TierTracepoint || e.TimeNs != 111 || e.Skb != 0xffff888812345678 ||
		e.NetNS != 4026531840 || e.Ifindex != 3 || e.PID != 4242 || e.CPU != 1 || e.Verdict != -1 || e.Cgroup != 77 {
		t.Errorf("scalars: %+v", e)
	}
	if e.CommString() != "getent" {
		t.Errorf("comm %q", e.CommString())
	}
	if got := e.Packet.String(); got != "10.0.0.1:40000->10.96.0.10:53" || e.Packet.Proto != 17 {
		t.Errorf("packet %s proto %d", got, e.Packet.Proto)
	}
	if e.CT.Ptr != 0xffff8888aaaa0000 || e.CT.Status != IPSDstNAT || e.CT.Confirmed() {
		t.Errorf("ct %+v", e.CT)
	}
	if e.CT.Reply.String() != "10.244.1.5:53->10.0.0.1:40000" || e.CT.Orig != e.Packet {
		t.Errorf("ct tuples %s / %s", e.CT.Orig, e.CT.Reply)
	}
	if e.Winner.Ptr != 0 || e.Winner.Orig.IsValid() {
		t.Errorf("winner should be empty: %+v", e.Winner)
	}
	d := e.DNS
	if !d.Valid || d.ID != 0x1234 || d.Response || d.QType != dns.TypeAAAA || d.NameTruncated ||
		d.QName() != "kubernetes.default.svc.cluster.local" {
		t.Errorf("dns %+v name %q", d, d.QName())
	}
}

func TestDecodeIPv6Response(t *testing.T) {
	var ev bpf.DnsraceEvent
	ev.Kind, ev.Tier = uint8(KindDeliver), uint8(TierTracepoint)
	s, d := netip.MustParseAddr("fd00::53"), netip.MustParseAddr("fd00::1")
	ev.Pkt.Saddr, ev.Pkt.Daddr = s.As16(), d.As16()
	ev.Pkt.Sport, ev.Pkt.Dport, ev.Pkt.Family, ev.Pkt.Proto = 53, 5353, 6, 17
	m := new(dns.Msg)
	m.SetQuestion("example.org.", dns.TypeA)
	m.Response, m.Rcode, m.Id = true, dns.RcodeNameError, 7
	b, _ := m.Pack()
	setDNS(&ev, b)

	var e Event
	if err := Decode(rawBytes(&ev), &e); err != nil {
		t.Fatal(err)
	}
	if e.Packet.String() != "[fd00::53]:53->[fd00::1]:5353" {
		t.Errorf("packet %s", e.Packet)
	}
	if !e.DNS.Valid || !e.DNS.Response || e.DNS.Rcode != dns.RcodeNameError || e.DNS.ID != 7 ||
		e.DNS.QName() != "example.org" || e.DNS.QType != dns.TypeA {
		t.Errorf("dns %+v %q", e.DNS, e.DNS.QName())
	}
}

func TestDecodeNames(t *testing.T) {
	long := bytes.Repeat([]byte("a"), 60)
	longName := string(long) + "." + string(long) + "." + string(long) + ".example." // 190 dotted bytes
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
			var ev bpf.DnsraceEvent
			ev.Kind = uint8(KindDrop)
			setDNS(&ev, c.msg)
			var e Event
			if err := Decode(rawBytes(&ev), &e); err != nil {
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

func TestDecodeErrors(t *testing.T) {
	var ev bpf.DnsraceEvent
	ev.Kind = uint8(KindSend)
	raw := rawBytes(&ev)
	var e Event
	if err := Decode(raw[:RawSize-1], &e); err != ErrShortRecord {
		t.Errorf("short: %v", err)
	}
	ev.Kind = 0
	if err := Decode(raw, &e); err != ErrBadKind {
		t.Errorf("kind 0: %v", err)
	}
	ev.Kind = 200
	if err := Decode(raw, &e); err != ErrBadKind {
		t.Errorf("kind 200: %v", err)
	}
	ev.Kind = uint8(KindSend)
	ev.DnsLen = 0xffff // more than the record holds: clamped
	if err := Decode(raw, &e); err != nil {
		t.Errorf("oversized dns_len: %v", err)
	}
}

func BenchmarkDecode(b *testing.B) {
	var ev bpf.DnsraceEvent
	ev.Kind, ev.Pkt.Family = uint8(KindXmit), 6
	ev.Ct.Ptr, ev.Ct.Orig.Family, ev.Ct.Reply.Family = 1, 6, 6
	setDNS(&ev, query(b, "kubernetes.default.svc.cluster.local.", dns.TypeAAAA))
	raw := rawBytes(&ev)
	var e Event
	b.ReportAllocs()
	for b.Loop() {
		if err := Decode(raw, &e); err != nil {
			b.Fatal(err)
		}
	}
}
