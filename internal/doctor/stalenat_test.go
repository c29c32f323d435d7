package doctor

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/ctentry"
	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

func TestStaleDeleteCommand(t *testing.T) {
	e := ctentry.Entry{Orig: ctentry.Tuple{Src: netip.MustParseAddrPort("10.1.0.7:40053"), Dst: netip.MustParseAddrPort("10.96.0.10:53"), Proto: unix.IPPROTO_UDP}}
	e6 := ctentry.Entry{Orig: ctentry.Tuple{Src: netip.MustParseAddrPort("[fd00::7]:40053"), Dst: netip.MustParseAddrPort("[fd00::a]:53"), Proto: unix.IPPROTO_UDP}}
	for _, c := range []struct {
		ns   string
		e    ctentry.Entry
		want string
	}{
		{"", e, "conntrack -D -p udp --orig-src 10.1.0.7 --orig-port-src 40053 --orig-dst 10.96.0.10 --orig-port-dst 53"},
		{"/run/netns/node1", e, "ip netns exec node1 conntrack -D -p udp --orig-src 10.1.0.7 --orig-port-src 40053 --orig-dst 10.96.0.10 --orig-port-dst 53"},
		{"/var/run/netns/cni-1234", e, "ip netns exec cni-1234 conntrack -D -p udp --orig-src 10.1.0.7 --orig-port-src 40053 --orig-dst 10.96.0.10 --orig-port-dst 53"},
		{"/proc/4242/ns/net", e, "nsenter --net=/proc/4242/ns/net conntrack -D -p udp --orig-src 10.1.0.7 --orig-port-src 40053 --orig-dst 10.96.0.10 --orig-port-dst 53"},
		{"/host/run/netns/node1", e6, "nsenter --net=/host/run/netns/node1 conntrack -D -f ipv6 -p udp --orig-src fd00::7 --orig-port-src 40053 --orig-dst fd00::a --orig-port-dst 53"},
	} {
		if got := (staleEntry{nsPath: c.ns, entry: c.e}).deleteCommand(); got != c.want {
			t.Errorf("%q:\n got %s\nwant %s", c.ns, got, c.want)
		}
	}
}

// The stale_nat incident for real: a scratch namespace DNATs the DNS VIP
// with kube-proxy's nftables shape to backend A; a client with a fixed
// source port keeps querying (its entry keeps being refreshed); the
// service is repointed to backend B the way kube-proxy does it, without
// deleting the entry. doctor must name the entry and A, print a delete
// command that works, and be ok once the entry is gone and the client's
// next query made a new one to B. Before the repoint (entries to the
// current backend only) it is ok too.
func TestLiveStaleNAT(t *testing.T) {
	name, path := newTestNetNS(t, "stale")
	for _, tool := range []string{"nft", "conntrack"} {
		if _, err := exec.LookPath(tool); err != nil {
			testutil.SkipOrFail(t, tool+" not installed (make deps)")
		}
	}
	for _, argv := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "d0", "type", "veth", "peer", "name", "d1"},
		{"addr", "add", "10.251.0.1/24", "dev", "d0"},
		{"link", "set", "d0", "up"},
		{"link", "set", "d1", "up"},
		// The backends sit behind a router that never answers: the
		// queries leave and are lost, their entries stay all the same.
		{"neigh", "add", "10.251.0.2", "lladdr", "02:00:00:00:00:02", "dev", "d0"},
		{"route", "add", "10.96.0.0/16", "via", "10.251.0.2"},
		{"route", "add", "10.244.0.0/16", "via", "10.251.0.2"},
	} {
		sh(t, "", append([]string{"ip", "-n", name}, argv...)...)
	}
	// kube-proxy nftables mode, one endpoint; the output hook, as for a
	// node-local cache's forwarder on the node itself.
	sh(t, `table ip kube-proxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.10 . udp . 53 : goto service-ULMVA6XW-kube-system/kube-dns/udp/dns }
	}
	chain nat-output {
		type nat hook output priority -100; policy accept;
		jump services
	}
	chain services {
		ip daddr . meta l4proto . th dport vmap @service-ips
	}
	chain service-ULMVA6XW-kube-system/kube-dns/udp/dns {
		numgen random mod 1 vmap { 0 : goto endpoint-A }
	}
	chain endpoint-A {
		meta l4proto udp dnat to 10.244.1.5:53
	}
}
`, "ip", "netns", "exec", name, "nft", "-f", "-")

	// Entries made from now on carry their start time.
	if err := nsutil.DoPath(path, func() error {
		return os.WriteFile("/proc/sys/net/netfilter/nf_conntrack_timestamp", []byte("1\n"), 0o644)
	}); err != nil {
		t.Fatalf("turning conntrack timestamps on: %v", err)
	}
	var conn *net.UDPConn
	if err := nsutil.DoPath(path, func() (err error) {
		conn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 251, 0, 1), Port: 40053})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	vip := &net.UDPAddr{IP: net.IPv4(10, 96, 0, 10), Port: 53}
	// query sends one datagram; on a local socket the output and
	// postrouting hooks run inside the call, so the entry exists when it
	// returns.
	query := func() {
		t.Helper()
		if _, err := conn.WriteToUDP([]byte("query"), vip); err != nil {
			t.Fatalf("sending to the VIP: %v", err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the client that keeps talking
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				_, _ = conn.WriteToUDP([]byte("query"), vip)
			}
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
		conn.Close()
	}()
	orig := ctentry.Tuple{Src: netip.MustParseAddrPort("10.251.0.1:40053"), Dst: netip.MustParseAddrPort("10.96.0.10:53"), Proto: unix.IPPROTO_UDP}
	wantTarget := func(want string) {
		t.Helper()
		e, err := ctentry.Get(path, orig)
		if err != nil {
			t.Fatalf("reading the client's entry: %v", err)
		}
		if e.DNATTarget() != netip.MustParseAddrPort(want) {
			t.Fatalf("the client's entry goes to %s, want %s", e.DNATTarget(), want)
		}
	}
	check := func() Result {
		t.Helper()
		rep, err := Run(context.Background(), Config{Root: "/", Live: true, NetNS: []string{path}, Checks: []string{"stale-nat"}})
		if err != nil {
			t.Fatal(err)
		}
		r := rep.Checks[0]
		t.Logf("[%s] %s%s\n  %s\n  fix: %s", r.Verdict, r.Summary, r.Reason, strings.Join(r.Evidence, "\n  "), r.Fix)
		return r
	}

	query()
	wantTarget("10.244.1.5:53")
	if r := check(); r.Verdict != OK || !slices.Contains(r.Evidence, path+": 10.96.0.10:53/udp DNATs to 10.244.1.5:53 (nftables ip kube-proxy)") {
		t.Errorf("before the repoint: %s, want ok with the service in the evidence", r.Verdict)
	}

	// kube-proxy's update when the endpoint pod is replaced: a new
	// endpoint chain, the service's map pointed at it, the old chain gone.
	// No conntrack flush.
	sh(t, `add chain ip kube-proxy endpoint-B
add rule ip kube-proxy endpoint-B meta l4proto udp dnat to 10.244.2.7:53
flush chain ip kube-proxy service-ULMVA6XW-kube-system/kube-dns/udp/dns
add rule ip kube-proxy service-ULMVA6XW-kube-system/kube-dns/udp/dns numgen random mod 1 vmap { 0 : goto endpoint-B }
delete chain ip kube-proxy endpoint-A
`, "ip", "netns", "exec", name, "nft", "-f", "-")
	query()
	wantTarget("10.244.1.5:53") // the entry outlives the rule

	r := check()
	if r.Verdict != Warn {
		t.Fatalf("after the repoint: %s, want warn", r.Verdict)
	}
	ev := strings.Join(r.Evidence, "\n")
	for _, want := range []string{
		"STALE " + path + ": udp 10.251.0.1:40053 -> 10.96.0.10:53 still goes to 10.244.1.5:53 (reply udp 10.244.1.5:53 -> 10.251.0.1:40053), not a current backend (10.244.2.7:53); ",
		path + ": 10.96.0.10:53/udp DNATs to 10.244.2.7:53 (nftables ip kube-proxy)",
	} {
		if !strings.Contains(ev, want) {
			t.Errorf("evidence lacks %q", want)
		}
	}
	if !regexp.MustCompile(`not a current backend \(10\.244\.2\.7:53\); \d+s left, age \d+s, CONFIRMED\|DST_NAT`).MatchString(ev) {
		t.Errorf("evidence lacks the entry's timeout, age and status")
	}
	if !strings.Contains(r.Summary, "10.244.1.5:53 ("+path+")") {
		t.Errorf("summary %q does not name the stale target", r.Summary)
	}
	wantCmd := "ip netns exec " + name + " conntrack -D -p udp --orig-src 10.251.0.1 --orig-port-src 40053 --orig-dst 10.96.0.10 --orig-port-dst 53"
	if !strings.Contains(r.Fix, wantCmd) || !strings.Contains(r.Fix, "kube-proxy is supposed to delete the UDP entries of removed endpoints") {
		t.Errorf("fix %q lacks %q and the kube-proxy note", r.Fix, wantCmd)
	}

	// The delete command doctor printed, as an operator would run it.
	var del []string
	for _, l := range r.Evidence {
		if c, ok := strings.CutPrefix(l, "  delete: "); ok {
			del = strings.Fields(c)
		}
	}
	if strings.Join(del, " ") != wantCmd {
		t.Fatalf("delete line %q, want %q", del, wantCmd)
	}
	if out, err := exec.Command(del[0], del[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", wantCmd, err, out)
	}
	query()
	wantTarget("10.244.2.7:53")
	if r := check(); r.Verdict != OK {
		t.Errorf("after the delete: %s, want ok", r.Verdict)
	}
}
