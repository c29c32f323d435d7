package event_test

import (
	"fmt"
	"net/netip"
	"unsafe"

	"github.com/miekg/dns"

	"github.com/dnsrace/dnsrace/internal/bpf"
	"github.com/dnsrace/dnsrace/internal/event"
)

// record is a raw ring buffer record as the kernel side sends it: a
// bpf2go-generated fixed part, then the DNS message bytes it carries.
func record[T any](fixed *T, msg []byte) []byte {
	b := unsafe.Slice((*byte)(unsafe.Pointer(fixed)), unsafe.Sizeof(*fixed))
	return append(append([]byte{}, b...), msg...)
}

// A reader decodes every record into one reused Event: a query first seen,
// its answer, and a drop of one of its packets, all named by the query's
// QID.
func ExampleDecode() {
	pod, vip := netip.MustParseAddr("10.244.0.12").As4(), netip.MustParseAddr("10.96.0.10").As4()
	m := new(dns.Msg)
	m.SetQuestion("kubernetes.default.svc.cluster.local.", dns.TypeAAAA)
	m.Id = 50852
	msg, _ := m.Pack()

	var q bpf.DnsraceRecQuery
	q.H.Type, q.H.Qid, q.H.Tier, q.H.Netns = uint8(bpf.DnsraceRecTypeREC_QUERY), 7, uint8(event.TierFentry), 4026532453
	q.Pid, q.DnsLen = 9937, uint16(len(msg))
	copy(q.Comm[:], "getent")
	copy(q.T.Saddr[:], pod[:])
	copy(q.T.Daddr[:], vip[:])
	q.T.Sport, q.T.Dport, q.T.Family, q.T.Proto = 53611, 53, 4, 17

	var a bpf.DnsraceRecAnswer
	a.H.Type, a.H.Qid, a.DnsFlags = uint8(bpf.DnsraceRecTypeREC_ANSWER), 7, 0x8183 // a response, NXDOMAIN

	var d bpf.DnsraceRecEvent
	d.H.Type, d.H.Qid, d.Kind = uint8(bpf.DnsraceRecTypeREC_EVENT), 7, uint8(bpf.DnsraceEvKindEV_DROP)
	d.Reason, d.Location = 2, 0xffffffff81a3c5d0
	d.Ct.Ptr = 0xffff8881c2e4b000
	copy(d.Ct.Orig.Saddr[:], pod[:])
	copy(d.Ct.Orig.Daddr[:], vip[:])
	d.Ct.Orig.Sport, d.Ct.Orig.Dport, d.Ct.Orig.Family, d.Ct.Orig.Proto = 53611, 53, 4, 17

	var e event.Event
	for _, raw := range [][]byte{record(&q, msg), record(&a, nil), record(&d, nil)} {
		if err := event.Decode(raw, &e); err != nil {
			fmt.Println(err)
			continue
		}
		switch e.Kind {
		case event.KindQuery:
			fmt.Printf("%v qid %d (%v, netns %d): %s pid %d %s: id %d %s? %s\n", e.Kind, e.QID, e.Tier, e.NetNS,
				event.CommString(e.Comm), e.PID, e.Packet, e.DNS.ID, dns.TypeToString[e.DNS.QType], e.DNS.QName())
		case event.KindAnswer:
			fmt.Printf("%v qid %d: %s\n", e.Kind, e.QID, dns.RcodeToString[int(e.DNS.Rcode)])
		default:
			fmt.Printf("%v qid %d: reason %d at %#x, entry %s confirmed %v\n", e.Kind, e.QID, e.Reason, e.Location,
				e.CT.Orig, e.CT.Confirmed())
		}
	}
	fmt.Println(event.Decode(record(&a, nil)[:event.HdrSize+4], &e))
	// Output:
	// query qid 7 (fentry, netns 4026532453): getent pid 9937 10.244.0.12:53611->10.96.0.10:53: id 50852 AAAA? kubernetes.default.svc.cluster.local
	// answer qid 7: NXDOMAIN
	// drop qid 7: reason 2 at 0xffffffff81a3c5d0, entry 10.244.0.12:53611->10.96.0.10:53 confirmed false
	// event: record shorter than its type's fixed part
}

// The question name is kept as the query sent it: Name's bytes are the
// message's, and QName shows it dotted, a byte outside printable ASCII or a
// dot inside a label as '?'. A record that ends inside the name (the
// kernel copies at most RawDNSCap bytes of a message, fewer when the
// packet's first segment is shorter) gives a cut name.
func ExampleDNS_Name() {
	msg := []byte("\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + // header: one question
		"\x03a.b\x04\x00\xffcd\x03lab\x00" + "\x00\x01\x00\x01") // a.b, \x00\xffcd, lab; A, IN
	for _, n := range []int{len(msg), 12 + 11} {
		var q bpf.DnsraceRecQuery
		q.H.Type, q.DnsLen = uint8(bpf.DnsraceRecTypeREC_QUERY), uint16(n)
		var e event.Event
		if err := event.Decode(record(&q, msg[:n]), &e); err != nil {
			fmt.Println(err)
			continue
		}
		name := e.DNS.Name()
		fmt.Printf("%d bytes: shown %s, sent %q, cut %v, labels traced whole %q\n", n, e.DNS.QName(), name.Wire(), name.Cut(), name.Labels())
	}
	// Output:
	// 30 bytes: shown a?b.??cd.lab, sent "\x03a.b\x04\x00\xffcd\x03lab\x00", cut false, labels traced whole "\x03a.b\x04\x00\xffcd\x03lab"
	// 23 bytes: shown a?b.??cd.l, sent "\x03a.b\x04\x00\xffcd\x03l", cut true, labels traced whole "\x03a.b\x04\x00\xffcd"
}
