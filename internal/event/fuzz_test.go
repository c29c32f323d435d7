package event

import (
	"bytes"
	"strings"
	"testing"

	"github.com/dnsrace/dnsrace/internal/bpf"
	"github.com/miekg/dns"
)

// FuzzDecode feeds arbitrary records to Decode: it must never panic, never
// report a name longer than MaxName, accept a record only if it is at least
// its type's fixed part, and decode a well-formed record of every type.
func FuzzDecode(f *testing.F) {
	var q bpf.DnsraceRecQuery
	q.T.Family = 4
	f.Add(queryRecord(&q, query(f, "example.com.", dns.TypeA)))
	var a bpf.DnsraceRecAnswer
	a.H.Type = recAnswer
	f.Add(append([]byte{}, bytesOf(&a)...))
	var ev bpf.DnsraceRecEvent
	ev.Kind, ev.Flags = uint8(bpf.DnsraceEvKindEV_DROP), FlagResponse
	f.Add(eventRecord(&ev, query(f, "svc-00.lab.test.", dns.TypeAAAA)))
	f.Add([]byte{})
	f.Add(make([]byte, EventSize))
	f.Add(eventRecord(&ev, nil)[:EventNoWinnerSize])
	f.Fuzz(func(t *testing.T, raw []byte) {
		var e Event
		err := Decode(raw, &e)
		if int(e.DNS.NameLen) > MaxName {
			t.Fatalf("name length %d", e.DNS.NameLen)
		}
		if err == nil {
			min := map[Kind]int{KindQuery: QuerySize, KindAnswer: AnswerSize}[e.Kind]
			if e.Kind >= KindDrop {
				min = EventNoCTSize
			}
			if e.Kind == KindInvalid || len(raw) < min {
				t.Fatalf("accepted %d bytes as %v", len(raw), e.Kind)
			}
		}
	})
}

// FuzzDNS feeds arbitrary DNS message prefixes to the question decoder, the
// part of a record that comes from the packet itself.
func FuzzDNS(f *testing.F) {
	f.Add(query(f, "example.com.", dns.TypeA))
	f.Add(query(f, "kubernetes.default.svc.cluster.local.", dns.TypeAAAA))
	f.Add([]byte{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 3, 'f', 'o', 'o', 0xc0, 0x0c})
	f.Add([]byte{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 3, 'a', '.', 'b', 2, 0, 0xff, 0, 0, 1, 0, 1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, msg []byte) {
		var d DNS
		decodeDNS(msg, &d)
		if int(d.NameLen) > MaxName {
			t.Fatalf("name length %d", d.NameLen)
		}
		if d.Valid && len(msg) < dnsHeaderSz {
			t.Fatalf("valid with %d bytes", len(msg))
		}
		// The name is the message's bytes, shown as QName shows it.
		n := d.Name()
		if n.Wire() != "" && !bytes.HasPrefix(msg[dnsHeaderSz:], []byte(n.Wire())) {
			t.Fatalf("name %q is not the message's %q", n.Wire(), msg[dnsHeaderSz:])
		}
		if !strings.HasPrefix(n.Wire(), n.Labels()) || n.String() != d.QName() {
			t.Fatalf("name %q: labels %q, shown %q, QName %q", n.Wire(), n.Labels(), n.String(), d.QName())
		}
		// A message miekg/dns parses has the same id and first question.
		var m dns.Msg
		if err := m.Unpack(msg); err == nil && len(m.Question) > 0 && d.Valid && !d.NameTruncated {
			if d.ID != m.Id || d.QType != m.Question[0].Qtype {
				t.Fatalf("id/qtype %d/%d, miekg %d/%d", d.ID, d.QType, m.Id, m.Question[0].Qtype)
			}
		}
		if err := m.Unpack(msg); err == nil && len(m.Question) > 0 && d.Valid && !n.Cut() {
			buf := make([]byte, 256)
			if l, err := dns.PackDomainName(m.Question[0].Name, buf, 0, nil, false); err == nil && string(buf[:l]) != n.Wire() {
				t.Fatalf("name %q, miekg's %q", n.Wire(), buf[:l])
			}
		}
	})
}
