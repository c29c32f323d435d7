package doctor

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// newTestNetNS creates a named namespace dnsrace-t-<tag>-<pid> removed at
// cleanup, and returns its path.
func newTestNetNS(t *testing.T, tag string) (string, string) {
	t.Helper()
	testutil.RequireRoot(t)
	name := fmt.Sprintf("dnsrace-t-%s-%d", tag, os.Getpid())
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

func sh(t *testing.T, stdin string, argv ...string) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
}

// A kube-proxy nftables-mode service for the DNS VIP with two endpoints,
// chosen per packet by numgen random, and masquerade without fully-random.
const labRuleset = `table ip kube-proxy {
	chain nat-output {
		type nat hook output priority -100; policy accept;
		ip daddr 10.96.0.10 udp dport 53 jump service-TESTDNS0-kube-system/kube-dns/udp/dns
	}
	chain service-TESTDNS0-kube-system/kube-dns/udp/dns {
		numgen random mod 2 vmap { 0 : goto endpoint-a, 1 : goto endpoint-b }
	}
	chain endpoint-a {
		meta l4proto udp dnat to 127.0.0.1:5301
	}
	chain endpoint-b {
		meta l4proto udp dnat to 127.0.0.1:5302
	}
	chain nat-postrouting {
		type nat hook postrouting priority 100; policy accept;
		oifname != "lo" masquerade
	}
}
`

// raceTraffic sends pairs of datagrams to the VIP from one connected
// socket per pair, the two writes issued at the same instant from threads
// pinned to different CPUs (the glibc A/AAAA shape). The sockets are made
// inside the namespace; the writes may come from any thread.
func raceTraffic(t *testing.T, nsPath string, pairs int) {
	t.Helper()
	var conns []*net.UDPConn
	err := inNetNS(nsPath, func() error {
		for i := 0; i < pairs; i++ {
			c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(10, 96, 0, 10), Port: 53})
			if err != nil {
				return err
			}
			conns = append(conns, c)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("making sockets in the netns: %v", err)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	ncpu := runtime.NumCPU()
	// A two-party barrier per pair: each worker announces pair i, waits
	// for the other, then writes. No third goroutine needs a CPU.
	var arrived [2]atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(w % ncpu)
			_ = unix.SchedSetaffinity(0, &set)
			msg := []byte{byte(w), 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0}
			for i := range conns {
				arrived[w].Store(int64(i + 1))
				for spins := 0; arrived[1-w].Load() < int64(i+1); spins++ {
					if spins > 1<<20 {
						runtime.Gosched()
						spins = 0
					}
				}
				conns[i].Write(msg)
			}
		}(w)
	}
	wg.Wait()
}

// The conntrack and kube-proxy checks, live, against a real namespace
// given with --netns: they must see the random DNS DNAT, the plain
// masquerade and the counters the traffic raised.
func TestLiveNetNS(t *testing.T) {
	name, path := newTestNetNS(t, "doctor")
	sh(t, "", "ip", "-n", name, "link", "set", "lo", "up")
	// A veth pair kept inside the namespace gives the VIP a route (no
	// dummy driver on every kernel).
	sh(t, "", "ip", "-n", name, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
	sh(t, "", "ip", "-n", name, "addr", "add", "10.250.0.1/24", "dev", "d0")
	sh(t, "", "ip", "-n", name, "link", "set", "d0", "up")
	sh(t, "", "ip", "-n", name, "link", "set", "d1", "up")
	sh(t, "", "ip", "-n", name, "route", "add", "default", "dev", "d0")
	sh(t, labRuleset, "ip", "netns", "exec", name, "nft", "-f", "-")

	before, err := ctstats.Read(path)
	if err != nil {
		t.Fatalf("reading counters: %v", err)
	}
	raceTraffic(t, path, 2000)
	after, err := ctstats.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	d := after.Total.Sub(before.Total)
	t.Logf("netns counters after 2000 pairs: entries=%d clash_resolve+%d insert_failed+%d drop+%d",
		after.Entries, d.ClashResolve, d.InsertFailed, d.Drop)
	if after.Entries == 0 {
		t.Fatal("traffic made no conntrack entries")
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{Root: "/", Live: true, NetNS: []string{path}, Checks: []string{"conntrack", "kube-proxy"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Checks {
		t.Logf("[%s] %s: %s\n  %s", r.Verdict, r.ID, r.Summary+r.Reason, strings.Join(r.Evidence, "\n  "))
	}
	ct, kp := rep.Checks[0], rep.Checks[1]
	if ct.Verdict == Skip {
		t.Fatalf("conntrack skipped: %s", ct.Reason)
	}
	wantLine := fmt.Sprintf("%s (ctnetlink): %d/", path, after.Entries)
	evs := strings.Join(ct.Evidence, "\n")
	if !strings.Contains(evs, path+" (ctnetlink): ") {
		t.Errorf("conntrack evidence lacks the netns (want like %q):\n%s", wantLine, evs)
	}
	if after.Total.ClashResolve > 0 && !strings.Contains(evs, fmt.Sprintf("clash_resolve=%d", after.Total.ClashResolve)) {
		t.Errorf("conntrack evidence lacks clash_resolve=%d:\n%s", after.Total.ClashResolve, evs)
	}
	if after.Total.InsertFailed > 0 && ct.Verdict != Warn {
		t.Errorf("insert_failed=%d but verdict %s", after.Total.InsertFailed, ct.Verdict)
	}

	if kp.Verdict != Warn {
		t.Fatalf("kube-proxy verdict %s, want warn: %s %s", kp.Verdict, kp.Summary, kp.Reason)
	}
	kev := strings.Join(kp.Evidence, "\n")
	for _, want := range []string{
		path + " nftables: ip kube-proxy/service-TESTDNS0-kube-system/kube-dns/udp/dns picks 1 of 2 DNS endpoints",
		path + " nftables: ip kube-proxy/nat-postrouting masquerade without --random-fully",
	} {
		if !strings.Contains(kev, want) {
			t.Errorf("kube-proxy evidence lacks %q:\n%s", want, kev)
		}
	}
	if !strings.Contains(kp.Summary, "random over 2 endpoints") {
		t.Errorf("summary %q", kp.Summary)
	}
}

// The same namespace read through iptables-save (iptables-nft) rules: a
// KUBE-SVC chain with -m statistic and a MASQUERADE without --random-fully.
func TestLiveNetNSIptables(t *testing.T) {
	if _, err := exec.LookPath("iptables-nft-restore"); err != nil {
		testutil.SkipOrFail(t, "iptables-nft-restore not installed (make install-deps)")
	}
	name, path := newTestNetNS(t, "ipt")
	sh(t, `*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-TCOU7JCQXEZGVUNU - [0:0]
:KUBE-SEP-A - [0:0]
:KUBE-SEP-B - [0:0]
-A OUTPUT -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-SVC-TCOU7JCQXEZGVUNU -m statistic --mode random --probability 0.5 -j KUBE-SEP-A
-A KUBE-SVC-TCOU7JCQXEZGVUNU -j KUBE-SEP-B
-A KUBE-SEP-A -p udp -j DNAT --to-destination 127.0.0.1:5301
-A KUBE-SEP-B -p udp -j DNAT --to-destination 127.0.0.1:5302
-A POSTROUTING -o d0 -j MASQUERADE
COMMIT
`, "ip", "netns", "exec", name, "iptables-nft-restore")
	rep, err := Run(context.Background(), Config{Root: "/", Live: true, NetNS: []string{path}, Checks: []string{"kube-proxy"}})
	if err != nil {
		t.Fatal(err)
	}
	kp := rep.Checks[0]
	kev := strings.Join(kp.Evidence, "\n")
	t.Logf("[%s] %s\n  %s", kp.Verdict, kp.Summary, strings.ReplaceAll(kev, "\n", "\n  "))
	for _, want := range []string{
		path + " iptables-nft-save: KUBE-SVC-TCOU7JCQXEZGVUNU picks 1 of 2 DNS endpoints",
		path + " iptables-nft-save: nat/POSTROUTING MASQUERADE without --random-fully",
	} {
		if !strings.Contains(kev, want) {
			t.Errorf("evidence lacks %q", want)
		}
	}
	if kp.Verdict != Warn {
		t.Errorf("verdict %s", kp.Verdict)
	}
}

// The tracing check's live trial loads on this machine: fentry is refused
// (EPERM) while tp_btf loads, so the tracepoint tier is reported.
func TestLiveTracing(t *testing.T) {
	testutil.RequireRoot(t)
	rep, err := Run(context.Background(), Config{Root: "/", Live: true, Checks: []string{"tracing", "kernel-fix"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Checks {
		t.Logf("[%s] %s: %s%s\n  %s", r.Verdict, r.ID, r.Summary, r.Reason, strings.Join(r.Evidence, "\n  "))
		if r.Verdict == Skip {
			t.Errorf("%s skipped live: %s", r.ID, r.Reason)
		}
	}
	var tr Result
	for _, r := range rep.Checks {
		if r.ID == "tracing" {
			tr = r
		}
	}
	ev := strings.Join(tr.Evidence, "\n")
	// This project's machines refuse fentry loads with EPERM (this-machine.md).
	if !strings.Contains(ev, "trial load fentry/__nf_conntrack_confirm: ") || !strings.Contains(ev, "trial load tp_btf/kfree_skb: ") {
		t.Errorf("no trial loads in evidence:\n%s", ev)
	}
}
