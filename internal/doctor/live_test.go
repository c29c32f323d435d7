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
	if testing.Short() {
		t.Skip("namespaces: not in -short")
	}
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

// The node namespace's rules: a kube-proxy nftables-mode service for the
// DNS VIP with two endpoints (both local to the node) chosen per packet by
// numgen random, and a masquerade towards the "outside" without
// fully-random, squeezed into one source port so that two flows leaving at
// once get the same reply tuple.
const labRuleset = `table ip kube-proxy {
	chain nat-prerouting {
		type nat hook prerouting priority -100; policy accept;
		ip daddr 10.96.0.10 udp dport 53 jump service-TESTDNS0-kube-system/kube-dns/udp/dns
	}
	chain service-TESTDNS0-kube-system/kube-dns/udp/dns {
		numgen random mod 2 vmap { 0 : goto endpoint-a, 1 : goto endpoint-b }
	}
	chain endpoint-a {
		meta l4proto udp dnat to 10.250.0.1:5301
	}
	chain endpoint-b {
		meta l4proto udp dnat to 10.250.0.1:5302
	}
	chain nat-postrouting {
		type nat hook postrouting priority 100; policy accept;
		oifname "n1" meta l4proto udp masquerade to :10000-10000
	}
}
`

// labTopology builds a pod namespace behind a node namespace (the
// Kubernetes shape: DNAT and confirm happen on the node's forwarding
// path, on whichever CPU handles each packet) and returns the node's path
// and the pod's path.
func labTopology(t *testing.T) (string, string) {
	node, nodePath := newTestNetNS(t, "node")
	pod, podPath := newTestNetNS(t, "pod")
	sh(t, "", "ip", "-n", node, "link", "set", "lo", "up")
	sh(t, "", "ip", "-n", pod, "link", "set", "lo", "up")
	sh(t, "", "ip", "-n", node, "link", "add", "n0", "type", "veth", "peer", "name", "p0", "netns", pod)
	sh(t, "", "ip", "-n", node, "addr", "add", "10.250.0.1/24", "dev", "n0")
	sh(t, "", "ip", "-n", node, "link", "set", "n0", "up")
	sh(t, "", "ip", "-n", pod, "addr", "add", "10.250.0.2/24", "dev", "p0")
	sh(t, "", "ip", "-n", pod, "link", "set", "p0", "up")
	sh(t, "", "ip", "-n", pod, "route", "add", "default", "via", "10.250.0.1")
	// The "outside": a veth whose peer stays in the node, and a static
	// neighbour, so forwarded packets leave without ARP.
	sh(t, "", "ip", "-n", node, "link", "add", "n1", "type", "veth", "peer", "name", "n1p")
	sh(t, "", "ip", "-n", node, "addr", "add", "10.250.1.1/24", "dev", "n1")
	sh(t, "", "ip", "-n", node, "link", "set", "n1", "up")
	sh(t, "", "ip", "-n", node, "link", "set", "n1p", "up")
	sh(t, "", "ip", "-n", node, "neigh", "add", "10.250.1.2", "lladdr", "02:00:00:00:01:02", "dev", "n1")
	if err := nsutil.DoPath(nodePath, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644)
	}); err != nil {
		t.Fatalf("enabling forwarding in the node namespace: %v", err)
	}
	sh(t, labRuleset, "ip", "netns", "exec", node, "nft", "-f", "-")
	return nodePath, podPath
}

// raceTraffic sends pairs of datagrams to the VIP from one connected
// socket per pair, the two writes issued at the same instant from threads
// pinned to different CPUs (the glibc A/AAAA shape). The sockets are made
// inside the namespace; the writes may come from any thread.
//
// With sameSocket the pair shares one socket to the DNS VIP (same 5-tuple);
// otherwise the pair is two sockets to 10.250.1.2:(20000+i), two flows that
// the node's one-port masquerade maps to the same reply tuple.
func raceTraffic(t *testing.T, nsPath string, pairs int, sameSocket bool) {
	t.Helper()
	var conns [2][]*net.UDPConn
	err := nsutil.DoPath(nsPath, func() error {
		for i := 0; i < pairs; i++ {
			dst := &net.UDPAddr{IP: net.IPv4(10, 96, 0, 10), Port: 53}
			if !sameSocket {
				dst = &net.UDPAddr{IP: net.IPv4(10, 250, 1, 2), Port: 20000 + i}
			}
			for w := 0; w < 2; w++ {
				if sameSocket && w == 1 {
					conns[1] = append(conns[1], conns[0][i])
					continue
				}
				c, err := net.DialUDP("udp4", nil, dst)
				if err != nil {
					return err
				}
				conns[w] = append(conns[w], c)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("making sockets in the netns: %v", err)
	}
	defer func() {
		for _, cs := range conns {
			for _, c := range cs {
				c.Close()
			}
		}
	}()
	// Raw fds: Go's UDPConn.Write holds a per-fd write lock, which would
	// serialize the pair that shares one socket.
	var fds [2][]int
	for w := range conns {
		for _, c := range conns[w] {
			rc, err := c.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			rc.Control(func(fd uintptr) { fds[w] = append(fds[w], int(fd)) })
		}
	}
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
			for i := range conns[w] {
				arrived[w].Store(int64(i + 1))
				for spins := 0; arrived[1-w].Load() < int64(i+1); spins++ {
					if spins > 1<<20 {
						runtime.Gosched()
						spins = 0
					}
				}
				_, _ = unix.Write(fds[w][i], msg)
			}
		}(w)
	}
	wg.Wait()
}

// The conntrack and kube-proxy checks, live, against a real namespace
// given with --netns: they must see the random DNS DNAT, the plain
// masquerade and the counters the traffic raised.
func TestLiveNetNS(t *testing.T) {
	path, podPath := labTopology(t)

	before, err := ctstats.Read(path)
	if err != nil {
		t.Fatalf("reading counters: %v", err)
	}
	// Same-socket pairs race only while both CPUs are free at once: more
	// rounds (bounded) when a busy machine gave the first none.
	var mid ctstats.Snapshot
	for round := 1; round <= 5; round++ {
		raceTraffic(t, podPath, 2000, true)
		if mid, err = ctstats.Read(path); err != nil {
			t.Fatal(err)
		}
		if mid.Total.ClashResolve > before.Total.ClashResolve || runtime.NumCPU() < 2 {
			break
		}
		t.Logf("round %d of 2000 same-socket pairs: no clash_resolve yet", round)
	}
	raceTraffic(t, podPath, 2000, false)
	after, err := ctstats.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	d1, d2 := mid.Total.Sub(before.Total), after.Total.Sub(mid.Total)
	t.Logf("node counters: same-socket pairs: clash_resolve+%d insert_failed+%d; two-flow pairs: clash_resolve+%d insert_failed+%d drop+%d; entries=%d",
		d1.ClashResolve, d1.InsertFailed, d2.ClashResolve, d2.InsertFailed, d2.Drop, after.Entries)
	if after.Entries == 0 {
		t.Fatal("traffic made no conntrack entries in the node namespace")
	}
	// The procfs reader (the --root path and the ctnetlink fallback) must
	// agree with the kernel's netlink answer on the same namespace.
	proc, err := readCTProcInNetNS(path)
	if err != nil {
		t.Fatalf("reading procfs in the namespace: %v", err)
	}
	if proc.Total.InsertFailed != after.Total.InsertFailed || proc.Total.ClashResolve != after.Total.ClashResolve ||
		proc.Total.Drop != after.Total.Drop || len(proc.PerCPU) != len(after.PerCPU) {
		t.Errorf("procfs %+v (%d CPUs) != ctnetlink %+v (%d CPUs)", proc.Total, len(proc.PerCPU), after.Total, len(after.PerCPU))
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
	evs := strings.Join(ct.Evidence, "\n")
	// Same-socket pairs race in the node's conntrack; the kernel's
	// clash_resolve counter (5.10+) must show it, and so must doctor.
	if d1.ClashResolve == 0 && runtime.NumCPU() >= 2 {
		t.Errorf("5 rounds of 2000 same-socket pairs raised no clash_resolve in the node namespace")
	}
	// Two flows squeezed into one masquerade port always collide on the
	// reply tuple (a race when both are unconfirmed, port exhaustion when
	// the first is already confirmed): insert_failed and drop, every kernel.
	if d2.InsertFailed == 0 || d2.Drop == 0 {
		t.Errorf("two-flow pairs: insert_failed+%d drop+%d, want both > 0", d2.InsertFailed, d2.Drop)
	}
	for _, want := range []string{
		fmt.Sprintf("%s (ctnetlink): ", path),
		fmt.Sprintf("insert_failed=%d drop=%d", after.Total.InsertFailed, after.Total.Drop),
		fmt.Sprintf("clash_resolve=%d", after.Total.ClashResolve),
	} {
		if !strings.Contains(evs, want) {
			t.Errorf("conntrack evidence lacks %q:\n%s", want, evs)
		}
	}
	if ct.Verdict != Warn || !strings.Contains(ct.Summary, path+" insert_failed=") {
		t.Errorf("conntrack: %s %q, want warn naming the namespace", ct.Verdict, ct.Summary)
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
	if testing.Short() {
		t.Skip("BPF trial loads: not in -short")
	}
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
	// An fentry program load can be refused (EPERM) where a tp_btf one
	// succeeds: on any kernel, the check must have tried both.
	if !strings.Contains(ev, "trial load fentry/__nf_conntrack_confirm: ") || !strings.Contains(ev, "trial load tp_btf/kfree_skb: ") {
		t.Errorf("no trial loads in evidence:\n%s", ev)
	}
}
