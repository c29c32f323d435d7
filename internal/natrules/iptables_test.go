package natrules

import (
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func aps(ss ...string) []netip.AddrPort {
	out := make([]netip.AddrPort, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddrPort(s)
	}
	return out
}

func wantBackends(t *testing.T, tb *Table, vip string, proto uint8, want ...string) {
	t.Helper()
	got, src, ok := tb.Backends(netip.MustParseAddrPort(vip), proto)
	if len(want) == 0 {
		if ok {
			t.Errorf("%s/%s: backends %v (%s), want none", vip, ProtoName(proto), got, src)
		}
		return
	}
	if !ok || !slices.Equal(got, aps(want...)) {
		t.Errorf("%s/%s: backends %v ok=%v (%s), want %v", vip, ProtoName(proto), got, ok, src, want)
	}
}

// kube-proxy's iptables mode, as iptables-nft-save prints it: a DNS
// service with two endpoints over UDP and TCP, its metrics port, the API
// server, a web service with three endpoints reached by ClusterIP, an
// external IP and a NodePort, and a service without endpoints (a REJECT in
// the filter table, no DNAT).
func TestKubeProxyIptables(t *testing.T) {
	b, err := os.ReadFile("testdata/kube-proxy-iptables.txt")
	if err != nil {
		t.Fatal(err)
	}
	tb := ParseIptablesSave("iptables-nft-save", string(b))
	for _, s := range tb.Services() {
		t.Logf("%s -> %v (%s)", s.Key(), s.Backends, s.Source)
	}
	udp, tcp := uint8(unix.IPPROTO_UDP), uint8(unix.IPPROTO_TCP)
	wantBackends(t, tb, "10.96.0.10:53", udp, "10.244.1.5:53", "10.244.2.7:53")
	wantBackends(t, tb, "10.96.0.10:53", tcp, "10.244.1.5:53", "10.244.2.7:53")
	wantBackends(t, tb, "10.96.0.10:9153", tcp, "10.244.1.5:9153", "10.244.2.7:9153")
	wantBackends(t, tb, "10.96.0.1:443", tcp, "192.168.0.100:6443")
	wantBackends(t, tb, "10.96.140.33:80", tcp, "10.244.3.21:8080", "10.244.3.22:8080", "10.244.3.23:8080")
	wantBackends(t, tb, "203.0.113.40:80", tcp, "10.244.3.21:8080", "10.244.3.22:8080", "10.244.3.23:8080")
	// Wrong port, wrong protocol, the service without endpoints.
	wantBackends(t, tb, "10.96.0.10:54", udp)
	wantBackends(t, tb, "10.96.0.10:9153", udp)
	wantBackends(t, tb, "10.96.77.12:80", tcp)
	if n := len(tb.Services()); n != 6 {
		t.Errorf("%d services, want 6", n)
	}
	dns := tb.DNS()
	if len(dns) != 2 || dns[0].Key() != "10.96.0.10:53/tcp" || dns[1].Key() != "10.96.0.10:53/udp" {
		t.Errorf("DNS services %+v", dns)
	}
	if _, src, _ := tb.Backends(netip.MustParseAddrPort("10.96.0.10:53"), udp); src != "iptables-nft-save nat" {
		t.Errorf("source %q", src)
	}
	if len(tb.Notes) != 0 {
		t.Errorf("notes %q", tb.Notes)
	}
	if !slices.Equal(tb.Sources, []string{"iptables-nft-save: 52 nat rules"}) {
		t.Errorf("sources %q", tb.Sources)
	}
}

// Shapes beyond kube-proxy's: goto, a DNAT without a port, one that any
// port or protocol reaches, multiport, prefixes, negation, rules shadowed
// by an earlier rule that surely ends the packet, and one that may not.
func TestIptablesShapes(t *testing.T) {
	tb := ParseIptablesSave("iptables-legacy-save", `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:DNS - [0:0]
:NEVER - [0:0]
-A PREROUTING -d 10.0.0.53/32 -p udp -m udp --dport 53 -g DNS
-A PREROUTING -d 10.0.0.53/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.9.9.9:53
-A PREROUTING -d 10.0.0.0/24 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.1.0.80:80
-A OUTPUT -d 10.0.0.54/32 -p udp -m multiport --dports 53,5353 -j DNAT --to-destination 10.1.0.3
-A OUTPUT -d 10.0.0.55/32 -j DNAT --to-destination 10.1.0.5:5353
-A OUTPUT -d 10.0.0.56/32 -p udp -m udp --dport 53 -m mark --mark 0x1 -j ACCEPT
-A OUTPUT -d 10.0.0.56/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.1.0.6:53
-A OUTPUT -d 10.0.0.57/32 -p udp -m udp --dport 53 -j ACCEPT
-A OUTPUT -d 10.0.0.57/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.1.0.7:53
-A OUTPUT ! -d 10.0.0.58/32 -p udp -m udp --dport 53 -j NEVER
-A OUTPUT -d 10.0.0.59/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.1.0.9-10.1.0.10:53
-A OUTPUT -d 10.0.0.60/32 -p udp -m udp --dport 53 -j REDIRECT --to-ports 5353
-A DNS -j DNAT --to-destination 10.1.0.1
-A NEVER -d 10.0.0.58/32 -j DNAT --to-destination 10.1.0.8:53
COMMIT
`)
	for _, s := range tb.Services() {
		t.Logf("%s -> %v", s.Key(), s.Backends)
	}
	udp, tcp := uint8(unix.IPPROTO_UDP), uint8(unix.IPPROTO_TCP)
	wantBackends(t, tb, "10.0.0.53:53", udp, "10.1.0.1:53") // the goto ends it: 10.9.9.9 is never reached
	wantBackends(t, tb, "10.0.0.7:80", tcp)                 // a prefix names no VIP
	wantBackends(t, tb, "10.0.0.54:53", udp, "10.1.0.3:53")
	wantBackends(t, tb, "10.0.0.54:5353", udp, "10.1.0.3:5353")
	wantBackends(t, tb, "10.0.0.54:54", udp)
	wantBackends(t, tb, "10.0.0.55:53", udp, "10.1.0.5:5353")
	wantBackends(t, tb, "10.0.0.55:53", tcp, "10.1.0.5:5353")
	wantBackends(t, tb, "10.0.0.56:53", udp, "10.1.0.6:53") // the mark may not match
	wantBackends(t, tb, "10.0.0.57:53", udp)                // ACCEPT came first
	wantBackends(t, tb, "10.0.0.58:53", udp)                // NEVER is entered only for other addresses
	wantBackends(t, tb, "10.0.0.59:53", udp, "10.1.0.9:53")
	wantBackends(t, tb, "10.0.0.60:53", udp)
	notes := strings.Join(tb.Notes, "\n")
	for _, want := range []string{"-A OUTPUT: DNAT to a range \"10.1.0.9-10.1.0.10:53\"", "-A OUTPUT: REDIRECT"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	var keys []string
	for _, s := range tb.DNS() {
		keys = append(keys, s.Key())
	}
	if want := []string{"10.0.0.53:53/udp", "10.0.0.54:53/udp", "10.0.0.55:*/any", "10.0.0.56:53/udp", "10.0.0.59:53/udp"}; !slices.Equal(keys, want) {
		t.Errorf("DNS services %q, want %q", keys, want)
	}
}

func TestIp6tables(t *testing.T) {
	tb := ParseIptablesSave("ip6tables-nft-save", `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-X - [0:0]
:KUBE-SEP-A - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d fd00:10:96::a/128 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-X
-A KUBE-SVC-X -j KUBE-SEP-A
-A KUBE-SEP-A -p udp -m udp -j DNAT --to-destination [fd00:10:244:1::5]:53
COMMIT
`)
	wantBackends(t, tb, "[fd00:10:96::a]:53", unix.IPPROTO_UDP, "[fd00:10:244:1::5]:53")
	if k := tb.DNS()[0].Key(); k != "[fd00:10:96::a]:53/udp" {
		t.Errorf("key %q", k)
	}
}

func TestParseToDestination(t *testing.T) {
	for _, c := range []struct {
		in    string
		want  string
		exact bool
	}{
		{"10.1.0.1:53", "10.1.0.1:53", true},
		{"10.1.0.1", "10.1.0.1:0", true},
		{"10.1.0.1-10.1.0.4", "10.1.0.1:0", false},
		{"10.1.0.1:53-54", "10.1.0.1:53", false},
		{"[fd00::5]:53", "[fd00::5]:53", true},
		{"fd00::5", "[fd00::5]:0", true},
	} {
		got, exact, err := parseToDestination(c.in)
		if err != nil || got.String() != c.want || exact != c.exact {
			t.Errorf("%q: %v %v %v, want %s %v", c.in, got, exact, err, c.want, c.exact)
		}
	}
	for _, bad := range []string{"", "x", "[fd00::5:53", "10.1.0.1:x", "10.1.0.1:70000"} {
		if _, _, err := parseToDestination(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestSplitSave(t *testing.T) {
	rules := SplitSave("*nat\n:X - [0:0]\n-A X -m comment --comment \"a \\\"b\\\" c\" -j Y\n-A\nCOMMIT\n*filter\n-A INPUT -j DROP\n")
	if len(rules) != 2 || rules[0].Table != "nat" || rules[0].Chain != "X" || rules[1].Table != "filter" {
		t.Fatalf("%+v", rules)
	}
	if w := rules[0].Words; len(w) != 8 || w[5] != `a "b" c` {
		t.Errorf("words %q", w)
	}
}

// FuzzParseIptablesSave: any text parses without panicking, and every
// service it reports has a VIP address and at least one backend address.
func FuzzParseIptablesSave(f *testing.F) {
	b, err := os.ReadFile("testdata/kube-proxy-iptables.txt")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(b))
	f.Add("*nat\n:A - [0:0]\n-A PREROUTING -g A\n-A A -j A\n-A OUTPUT ! -d 10.0.0.1 -p udp -m multiport --dports 53,1:2 -j DNAT --to-destination [::1]:5\nCOMMIT\n")
	f.Add("*nat\n-A OUTPUT -d 10.0.0.1/255.255.255.255 -p 17 --dport 53 -j DNAT --to-destination 10.1.0.1-10.1.0.9:1-2\n")
	f.Fuzz(func(t *testing.T, s string) {
		tb := ParseIptablesSave("fuzz", s)
		for _, svc := range tb.Services() {
			if !svc.VIP.Addr().IsValid() || len(svc.Backends) == 0 {
				t.Errorf("service %+v", svc)
			}
			for _, b := range svc.Backends {
				if !b.Addr().IsValid() {
					t.Errorf("backend %v of %s", b, svc.Key())
				}
			}
		}
	})
}
