package doctor

import (
	"strings"
	"testing"
)

func TestParseResolvConf(t *testing.T) {
	rc, err := ParseResolvConf([]byte(`# No DNS servers known.
; old style comment
nameserver 10.0.0.10
nameserver fe80::1%eth0
nameserver not-an-ip
nameserver
domain example.com
search default.svc.cluster.local svc.cluster.local cluster.local
options ndots:5 timeout:50 attempts:x single-request-reopen
options use-vc
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(rc.NameserverStrings(), " "); got != "10.0.0.10 fe80::1%eth0" {
		t.Errorf("nameservers %q", got)
	}
	if len(rc.BadNameservers) != 2 {
		t.Errorf("bad nameservers %q", rc.BadNameservers)
	}
	if len(rc.Search) != 3 || rc.Search[0] != "default.svc.cluster.local" {
		t.Errorf("search %q (the last search/domain line wins)", rc.Search)
	}
	if rc.Ndots() != 5 || rc.Timeout() != 30 || rc.Attempts() != 2 {
		t.Errorf("ndots %d timeout %d attempts %d, want 5 30(capped) 2(default)", rc.Ndots(), rc.Timeout(), rc.Attempts())
	}
	if !rc.Has("single-request-reopen") || !rc.Has("use-vc") || rc.Has("rotate") {
		t.Errorf("options %q", rc.OptionsString())
	}
	if !rc.commentMentions("No DNS servers known") {
		t.Error("comment not kept")
	}
	for _, bad := range [][]byte{[]byte("nameserver 1.1.1.1\x00"), {0xff, 0xfe}, []byte("x" + strings.Repeat("y", 5000))} {
		if _, err := ParseResolvConf(bad); err == nil {
			t.Errorf("ParseResolvConf(%.20q): want error", bad)
		}
	}
}

func FuzzParseResolvConf(f *testing.F) {
	f.Add([]byte("nameserver 10.0.0.10\nsearch a b\noptions ndots:5 single-request-reopen\n"))
	f.Add([]byte("# No DNS servers known.\n"))
	f.Add([]byte("nameserver ::1%lo\noptions timeout:-1 attempts:99999999999999999999 :x\n"))
	f.Add([]byte("domain\nsearch\noptions\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		rc, err := ParseResolvConf(data)
		if err != nil {
			return
		}
		for _, a := range rc.Nameservers {
			if !a.IsValid() {
				t.Fatalf("invalid nameserver accepted from %q", data)
			}
		}
		for _, o := range rc.Options {
			if o.Name == "" {
				t.Fatalf("empty option name from %q", data)
			}
		}
		if n := rc.Ndots(); n < 0 || n > 15 {
			t.Fatalf("ndots %d", n)
		}
		if n := rc.Timeout(); n < 0 || n > 30 {
			t.Fatalf("timeout %d", n)
		}
		if n := rc.Attempts(); n < 0 || n > 5 {
			t.Fatalf("attempts %d", n)
		}
		_ = describeResolv("/etc/resolv.conf", rc)
	})
}

// The shape kube-proxy's nftables mode writes (pkg/proxy/nftables).
const nftKubeProxy = `table ip kube-proxy {
	comment "rules for kube-proxy"
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { 10.96.0.10 . udp . 53 : goto service-ULMVA6XW-kube-system/kube-dns/udp/dns,
			     10.96.0.1 . tcp . 443 : goto service-2QRHZV4L-default/kubernetes/tcp/https }
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

	chain service-ULMVA6XW-kube-system/kube-dns/udp/dns {
		ip daddr 10.96.0.10 udp dport 53 ip saddr != 10.244.0.0/16 jump mark-for-masquerade
		numgen random mod 2 vmap { 0 : goto endpoint-5OJB2KTY-kube-system/kube-dns/udp/dns__10.244.0.2/53, 1 : goto endpoint-2ZLAZ7QI-kube-system/kube-dns/udp/dns__10.244.0.3/53 }
	}

	chain service-2QRHZV4L-default/kubernetes/tcp/https {
		numgen random mod 3 vmap {
			0 : goto endpoint-a,
			1 : goto endpoint-b,
			2 : goto endpoint-c
		}
	}
}
table ip nat {
	chain POSTROUTING {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "eth0" masquerade
		ip saddr 10.1.0.0/16 snat to 192.0.2.1 random
	}
}
table ip raw {
	chain PREROUTING {
		type filter hook prerouting priority raw; policy accept;
		ip daddr 169.254.20.10 udp dport 53 notrack
	}
}
`

func TestParseNftText(t *testing.T) {
	f := parseNftText("nft", nftKubeProxy)
	if len(f.LB) != 2 {
		t.Fatalf("LB %+v", f.LB)
	}
	if !f.LB[0].DNS || f.LB[0].Endpoints != 2 || !strings.Contains(f.LB[0].Chain, "kube-dns") {
		t.Errorf("dns LB %+v", f.LB[0])
	}
	if f.LB[1].DNS || f.LB[1].Endpoints != 3 {
		t.Errorf("https LB %+v (multi-line vmap)", f.LB[1])
	}
	if len(f.NAT) != 3 {
		t.Fatalf("NAT %+v", f.NAT)
	}
	if !f.NAT[0].FullyRandom || f.NAT[1].FullyRandom || f.NAT[1].Random || !f.NAT[2].Random || f.NAT[2].FullyRandom {
		t.Errorf("NAT flags %+v", f.NAT)
	}
	if len(f.Notrack) != 1 {
		t.Errorf("notrack %q", f.Notrack)
	}
}

func TestParseIptablesSave(t *testing.T) {
	f := parseIptablesSave("ipt", `*nat
-A KUBE-SERVICES -d 10.0.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-AAA
-A KUBE-SVC-AAA -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-1
-A KUBE-SVC-AAA -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-2
-A KUBE-SVC-AAA -j KUBE-SEP-3
-A KUBE-SVC-BBB -m comment --comment "default/web:http" -m statistic --mode random --probability 0.5 -j KUBE-SEP-4
-A KUBE-SVC-BBB -j KUBE-SEP-5
-A KUBE-POSTROUTING -j MASQUERADE --random-fully
-A POSTROUTING -s 10.1.0.0/16 -j SNAT --to-source 192.0.2.1 --random
COMMIT
*raw
-A PREROUTING -d 169.254.20.10/32 -p udp -m udp --dport 53 -j CT --notrack
COMMIT
`)
	if len(f.LB) != 2 || !f.LB[0].DNS || f.LB[0].Endpoints != 3 || f.LB[1].DNS || f.LB[1].Endpoints != 2 {
		t.Errorf("LB %+v", f.LB)
	}
	if len(f.NAT) != 2 || !f.NAT[0].FullyRandom || !f.NAT[1].Random || f.NAT[1].FullyRandom {
		t.Errorf("NAT %+v", f.NAT)
	}
	if len(f.Notrack) != 1 {
		t.Errorf("notrack %q", f.Notrack)
	}
}

func TestParseCTStatOldLayout(t *testing.T) {
	// 4.x/5.4: "searched" (meaningless since 5.10's rename) and delete_list.
	s, err := parseCTStat([]byte("entries  searched found new invalid ignore delete delete_list insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n" +
		"00000010  000000ff 00000001 00000000 00000000 00000000 00000000 00000000 00000000 00000002 00000003 00000004 00000000  00000000 00000000 00000000 00000000\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Total.ClashResolve != 0 || s.Total.InsertFailed != 2 || s.Total.Drop != 3 || s.Total.EarlyDrop != 4 || s.Entries != 16 {
		t.Errorf("%+v", s)
	}
}

func TestResolveInReroots(t *testing.T) {
	root := copyTree(t, "testdata/healthy")
	// An absolute link must resolve inside the root, not on this machine.
	p := root + "/etc/resolv.conf"
	if err := removeAndLink(p, "/run/systemd/resolve/resolv.conf"); err != nil {
		t.Fatal(err)
	}
	data, chain, err := readIn(root, "/etc/resolv.conf")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "168.63.129.16") || len(chain) != 1 {
		t.Errorf("data %q chain %q", data, chain)
	}
}
