package event

import (
	"testing"

	"github.com/dnsrace/dnsrace/internal/bpf"
	"github.com/miekg/dns"
)

// FuzzDecode feeds arbitrary records and DNS prefixes to Decode: it must
// never panic, never report a name longer than MaxName, and a record of
// the right size with a known kind must decode.
func FuzzDecode(f *testing.F) {
	var ev bpf.DnsraceEvent
	ev.Kind, ev.Pkt.Family = uint8(KindXmit), 4
	setDNS(&ev, query(f, "example.com.", dns.TypeA))
	f.Add(append([]byte{}, rawBytes(&ev)...))
	f.Add([]byte{})
	f.Add(make([]byte, RawSize))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var e Event
		err := Decode(raw, &e)
		if len(raw) >= RawSize && raw[offKind] > 0 && raw[offKind] < uint8(kindMax) && err != nil {
			t.Fatalf("valid record rejected: %v", err)
		}
		if int(e.DNS.NameLen) > MaxName {
			t.Fatalf("name length %d", e.DNS.NameLen)
		}
		// The DNS parser on its own, with the fuzz input as the message.
		var d DNS
		decodeDNS(raw, &d)
		if int(d.NameLen) > MaxName {
			t.Fatalf("name length %d", d.NameLen)
		}
	})
}
