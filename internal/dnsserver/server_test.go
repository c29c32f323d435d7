package dnsserver

import (
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func exchange(t *testing.T, addr netip.AddrPort, qtype uint16) (*dns.Msg, error) {
	t.Helper()
	c := &dns.Client{Timeout: 300 * time.Millisecond}
	m := new(dns.Msg).SetQuestion("svc-00.lab.test.", qtype)
	r, _, err := c.Exchange(m, addr.String())
	return r, err
}

func TestAnswersAandAAAA(t *testing.T) {
	s, err := Start(Config{Addr: netip.MustParseAddrPort("127.0.0.1:0")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	addr := s.conn.LocalAddr().(interface{ AddrPort() netip.AddrPort }).AddrPort()
	for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
		r, err := exchange(t, addr, qt)
		if err != nil {
			t.Fatalf("%s: %v", dns.TypeToString[qt], err)
		}
		if len(r.Answer) != 1 || r.Answer[0].Header().Rrtype != qt {
			t.Fatalf("%s: answer %v", dns.TypeToString[qt], r.Answer)
		}
	}
	if st := s.Stats(); st.Received != 2 || st.Answered != 2 || st.Ignored != 0 {
		t.Fatalf("stats %+v, want 2 received and answered", st)
	}
}

func TestIgnoreAll(t *testing.T) {
	s, err := Start(Config{Addr: netip.MustParseAddrPort("127.0.0.1:0"), IgnoreFraction: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	addr := s.conn.LocalAddr().(interface{ AddrPort() netip.AddrPort }).AddrPort()
	if _, err := exchange(t, addr, dns.TypeA); err == nil {
		t.Fatal("got an answer from a server that ignores everything")
	}
	if st := s.Stats(); st.Received != 1 || st.Ignored != 1 || st.Answered != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestReplyFromOtherAddress(t *testing.T) {
	s, err := Start(Config{
		Addr:      netip.MustParseAddrPort("127.0.0.1:0"),
		ReplyFrom: netip.MustParseAddrPort("127.0.0.2:0"),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	addr := s.conn.LocalAddr().(interface{ AddrPort() netip.AddrPort }).AddrPort()
	// A connected client ignores a reply from another address: the
	// resolver-side symptom of the wrong-source bug.
	if _, err := exchange(t, addr, dns.TypeA); err == nil {
		t.Fatal("connected client accepted a reply from another address")
	}
	if st := s.Stats(); st.Answered != 1 {
		t.Fatalf("stats %+v, want the reply sent", st)
	}
}
