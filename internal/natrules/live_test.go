package natrules

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// scratchNS creates a named namespace removed at cleanup and returns its
// name and path.
func scratchNS(t *testing.T, tag string) (string, string) {
	t.Helper()
	testutil.RequireRoot(t)
	name := fmt.Sprintf("dnsrace-t-nat%s-%d", tag, os.Getpid())
	_ = nsutil.Delete(name)
	if err := nsutil.Create(name); err != nil {
		t.Fatalf("creating netns: %v", err)
	}
	t.Cleanup(func() {
		if err := nsutil.Delete(name); err != nil {
			t.Errorf("deleting netns %s: %v", name, err)
		}
	})
	return name, nsutil.Path(name)
}

func run(t *testing.T, stdin string, argv ...string) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
}

func readLive(t *testing.T, path string) *Table {
	t.Helper()
	tb, err := Read(context.Background(), path)
	if err != nil {
		t.Fatalf("reading the rules of %s: %v", path, err)
	}
	for _, s := range tb.Sources {
		t.Logf("source: %s", s)
	}
	for _, s := range tb.Services() {
		t.Logf("%s -> %v (%s)", s.Key(), s.Backends, s.Source)
	}
	for _, n := range tb.Notes {
		t.Logf("note: %s", n)
	}
	return tb
}

// The lab's own rules (internal/lab addNAT), written over netlink the way
// the lab writes them, read back.
func TestReadLabShape(t *testing.T) {
	_, path := scratchNS(t, "lab")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())), nftables.AsLasting())
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseLasting()
	tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "dnsrace"})
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	backends := []string{"10.250.2.1", "10.250.2.2"}
	for i, b := range backends {
		ex := daddrProtoPort("10.96.0.10", unix.IPPROTO_UDP, 53)
		if left := len(backends) - i; left > 1 {
			ex = append(ex,
				&expr.Numgen{Register: 1, Modulus: uint32(left), Type: unix.NFT_NG_RANDOM},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, 0)})
		}
		ex = append(ex,
			&expr.Immediate{Register: 1, Data: ip4(b)},
			&expr.Immediate{Register: 2, Data: be16(5353)},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true})
		c.AddRule(&nftables.Rule{Table: tbl, Chain: pre, Exprs: ex})
	}
	c.AddChain(&nftables.Chain{Name: "postrouting", Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	if err := c.Flush(); err != nil {
		t.Fatalf("installing rules: %v", err)
	}
	tb := readLive(t, path)
	wantBackends(t, tb, "10.96.0.10:53", unix.IPPROTO_UDP, "10.250.2.1:5353", "10.250.2.2:5353")
	if len(tb.DNS()) != 1 {
		t.Errorf("DNS services %+v", tb.DNS())
	}
}

// kube-proxy's nftables mode as knftables writes it (through nft): the
// service-ips verdict map, numgen maps, endpoint chains with dnat; plus a
// second table in the inet family with an IPv6 service.
const kubeProxyNft = `table ip kube-proxy {
	comment "rules for kube-proxy"
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { 10.96.0.10 . udp . 53 : goto service-ULMVA6XW-kube-system/kube-dns/udp/dns,
			     10.96.0.10 . tcp . 53 : goto service-FGA3TOBB-kube-system/kube-dns/tcp/dns-tcp,
			     10.96.0.1 . tcp . 443 : goto service-2QRHZV4L-default/kubernetes/tcp/https }
	}
	map service-nodeports {
		type inet_proto . inet_service : verdict
		comment "NodePort traffic"
	}
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}
	chain nat-output {
		type nat hook output priority -100; policy accept;
		jump services
	}
	chain nat-postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		jump masquerading
	}
	chain masquerading {
		meta mark & 0x00004000 == 0x00000000 return
		meta mark set meta mark ^ 0x00004000
		masquerade fully-random
	}
	chain mark-for-masquerade {
		meta mark set meta mark | 0x00004000
	}
	chain services {
		ip daddr . meta l4proto . th dport vmap @service-ips
		fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports
	}
	chain service-ULMVA6XW-kube-system/kube-dns/udp/dns {
		ip daddr 10.96.0.10 udp dport 53 ip saddr != 10.244.0.0/16 jump mark-for-masquerade
		numgen random mod 2 vmap { 0 : goto endpoint-5OJB2KTY-kube-system/kube-dns/udp/dns__10.244.1.5/53, 1 : goto endpoint-ZQ4B3V6L-kube-system/kube-dns/udp/dns__10.244.2.7/53 }
	}
	chain endpoint-5OJB2KTY-kube-system/kube-dns/udp/dns__10.244.1.5/53 {
		ip saddr 10.244.1.5 jump mark-for-masquerade
		meta l4proto udp dnat to 10.244.1.5:53
	}
	chain endpoint-ZQ4B3V6L-kube-system/kube-dns/udp/dns__10.244.2.7/53 {
		ip saddr 10.244.2.7 jump mark-for-masquerade
		meta l4proto udp dnat to 10.244.2.7:53
	}
	chain service-FGA3TOBB-kube-system/kube-dns/tcp/dns-tcp {
		ip daddr 10.96.0.10 tcp dport 53 ip saddr != 10.244.0.0/16 jump mark-for-masquerade
		numgen random mod 1 vmap { 0 : goto endpoint-WYZ3XK4Q-kube-system/kube-dns/tcp/dns-tcp__10.244.1.5/53 }
	}
	chain endpoint-WYZ3XK4Q-kube-system/kube-dns/tcp/dns-tcp__10.244.1.5/53 {
		ip saddr 10.244.1.5 jump mark-for-masquerade
		meta l4proto tcp dnat to 10.244.1.5:53
	}
	chain service-2QRHZV4L-default/kubernetes/tcp/https {
		ip daddr 10.96.0.1 tcp dport 443 ip saddr != 10.244.0.0/16 jump mark-for-masquerade
		numgen random mod 1 vmap { 0 : goto endpoint-GCA7E6SL-default/kubernetes/tcp/https__192.168.0.100/6443 }
	}
	chain endpoint-GCA7E6SL-default/kubernetes/tcp/https__192.168.0.100/6443 {
		ip saddr 192.168.0.100 jump mark-for-masquerade
		meta l4proto tcp dnat to 192.168.0.100:6443
	}
}
table inet dns6 {
	chain dstnat {
		type nat hook prerouting priority dstnat; policy accept;
		ip6 daddr fd00:10:96::a udp dport 53 dnat ip6 to [fd00:10:244:1::5]:53
		ip daddr { 10.96.0.20, 10.96.0.21 } udp dport 53 dnat ip to 10.244.0.20
	}
}
`

func TestReadKubeProxyNft(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		testutil.SkipOrFail(t, "nft not installed (make deps)")
	}
	name, path := scratchNS(t, "kpn")
	run(t, kubeProxyNft, "ip", "netns", "exec", name, "nft", "-f", "-")
	tb := readLive(t, path)
	udp, tcp := uint8(unix.IPPROTO_UDP), uint8(unix.IPPROTO_TCP)
	wantBackends(t, tb, "10.96.0.10:53", udp, "10.244.1.5:53", "10.244.2.7:53")
	wantBackends(t, tb, "10.96.0.10:53", tcp, "10.244.1.5:53")
	wantBackends(t, tb, "10.96.0.1:443", tcp, "192.168.0.100:6443")
	wantBackends(t, tb, "[fd00:10:96::a]:53", udp, "[fd00:10:244:1::5]:53")
	wantBackends(t, tb, "10.96.0.20:53", udp, "10.244.0.20:53")
	wantBackends(t, tb, "10.96.0.21:53", udp, "10.244.0.20:53")
	wantBackends(t, tb, "10.96.0.22:53", udp)
	if len(tb.Services()) != 6 {
		t.Errorf("%d services, want 6", len(tb.Services()))
	}
	if _, src, _ := tb.Backends(netip.MustParseAddrPort("10.96.0.10:53"), udp); src != "nftables ip kube-proxy" {
		t.Errorf("source %q", src)
	}
	for _, n := range tb.Notes {
		if strings.Contains(n, "nftables") {
			t.Errorf("note on nftables rules that should be understood: %s", n)
		}
	}
}

// kube-proxy's iptables mode restored with iptables-nft-restore and, in a
// second namespace, iptables-legacy-restore: Read must find the same
// services through iptables-save, and nothing it misreads over netlink
// from iptables-nft's tables.
func TestReadKubeProxyIptables(t *testing.T) {
	dump, err := os.ReadFile("testdata/kube-proxy-iptables.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, variant := range []string{"nft", "legacy"} {
		t.Run(variant, func(t *testing.T) {
			restore := "iptables-" + variant + "-restore"
			if _, err := exec.LookPath(restore); err != nil {
				testutil.SkipOrFail(t, restore+" not installed (make deps)")
			}
			name, path := scratchNS(t, "ipt"+variant[:1])
			run(t, string(dump), "ip", "netns", "exec", name, restore)
			tb := readLive(t, path)
			udp, tcp := uint8(unix.IPPROTO_UDP), uint8(unix.IPPROTO_TCP)
			wantBackends(t, tb, "10.96.0.10:53", udp, "10.244.1.5:53", "10.244.2.7:53")
			wantBackends(t, tb, "10.96.0.10:53", tcp, "10.244.1.5:53", "10.244.2.7:53")
			wantBackends(t, tb, "10.96.140.33:80", tcp, "10.244.3.21:8080", "10.244.3.22:8080", "10.244.3.23:8080")
			if n := len(tb.Services()); n != 6 {
				t.Errorf("%d services, want 6", n)
			}
			_, src, _ := tb.Backends(netip.MustParseAddrPort("10.96.0.10:53"), udp)
			if want := "iptables-" + variant + "-save nat"; src != want {
				t.Errorf("source %q, want %q", src, want)
			}
		})
	}
}
