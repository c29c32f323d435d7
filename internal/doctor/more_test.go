package doctor

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/testutil"
)

func runOneCheck(t *testing.T, cfg Config, id string) Result {
	t.Helper()
	cfg.Checks = []string{id}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rep.Checks[0]
}

// The stub case: /etc/resolv.conf says 127.0.0.53, which looks fine, but
// resolved has no uplink servers behind it.
func TestResolversStubWithoutUplinks(t *testing.T) {
	root := copyTree(t, "testdata/healthy")
	if err := os.WriteFile(filepath.Join(root, "run/systemd/resolve/resolv.conf"),
		[]byte("# This file is managed by man:systemd-resolved(8). Do not edit.\n\n# No DNS servers known.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runOneCheck(t, Config{Root: root}, "resolvers")
	if r.Verdict != Fail || r.Summary != `systemd-resolved stub 127.0.0.53 has no uplink servers ("No DNS servers known.")` {
		t.Errorf("%s %q %q", r.Verdict, r.Summary, r.Evidence)
	}
}

// kubelet's resolvConf is what CoreDNS forwards to; an empty one fails even
// when /etc/resolv.conf is a working static file.
func TestResolversKubeletResolvConf(t *testing.T) {
	root := copyTree(t, "testdata/healthy")
	os.Remove(filepath.Join(root, "etc/resolv.conf"))
	os.WriteFile(filepath.Join(root, "etc/resolv.conf"), []byte("nameserver 10.1.2.3\n"), 0o644)
	os.WriteFile(filepath.Join(root, "run/systemd/resolve/resolv.conf"), []byte("# No DNS servers known.\n"), 0o644)
	r := runOneCheck(t, Config{Root: root}, "resolvers")
	if r.Verdict != Fail || !strings.Contains(r.Summary, "kubelet's resolvConf /run/systemd/resolve/resolv.conf has no usable nameserver") {
		t.Errorf("%s %q %q", r.Verdict, r.Summary, r.Evidence)
	}
}

// A saved nft ruleset (kube-proxy nftables mode) given as a file.
func TestKubeProxyNftDump(t *testing.T) {
	f := filepath.Join(t.TempDir(), "nft.txt")
	if err := os.WriteFile(f, []byte(nftKubeProxy), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runOneCheck(t, Config{Root: t.TempDir(), NftRuleset: f}, "kube-proxy")
	ev := strings.Join(r.Evidence, "\n")
	if r.Verdict != Warn || !strings.Contains(r.Summary, "1 source NAT rule(s) without --random-fully") ||
		strings.Contains(r.Summary, "DNS VIP") {
		t.Errorf("%s %q\n%s", r.Verdict, r.Summary, ev)
	}
	for _, want := range []string{"picks 1 of 2 DNS endpoints", "NOTRACK: ", "ip nat/POSTROUTING masquerade without --random-fully",
		"ip kube-proxy/masquerading masquerade fully random"} {
		if !strings.Contains(ev, want) {
			t.Errorf("evidence lacks %q:\n%s", want, ev)
		}
	}
}

// pod-resolvers, live: a process in its own mount namespace with its own
// /etc/resolv.conf bind-mounted is found through /proc/PID/root.
func TestLivePodResolvers(t *testing.T) {
	if testing.Short() {
		t.Skip("mount namespaces: not in -short")
	}
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		testutil.SkipOrFail(t, "unshare (util-linux) not installed")
	}
	dir := t.TempDir()
	rc := filepath.Join(dir, "resolv.conf")
	os.WriteFile(rc, []byte("nameserver 10.96.0.10\nsearch dnsrace-t.svc.cluster.local\noptions ndots:5 use-vc\n"), 0o644)
	ready := filepath.Join(dir, "ready")
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
		"mount --bind "+rc+" /etc/resolv.conf && touch "+ready+" && exec sleep 30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for i := 0; ; i++ {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if i > 100 {
			t.Fatal("container stand-in did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	r := runOneCheck(t, Config{Root: "/", Live: true}, "pod-resolvers")
	ev := strings.Join(r.Evidence, "\n")
	t.Logf("[%s] %s%s\n%s", r.Verdict, r.Summary, r.Reason, ev)
	if r.Verdict == Skip || !strings.Contains(ev, "nameserver 10.96.0.10, options ndots:5 use-vc") {
		t.Errorf("the unshared process was not found:\n%s", ev)
	}
}

// A static /etc/resolv.conf that works, while systemd-resolved has lost
// its uplinks: warn, because the stub and kubelet's default file are dead.
func TestResolversStaticButResolvedEmpty(t *testing.T) {
	root := copyTree(t, "testdata/healthy")
	os.Remove(filepath.Join(root, "etc/resolv.conf"))
	os.Remove(filepath.Join(root, "var/lib/kubelet/config.yaml"))
	os.WriteFile(filepath.Join(root, "etc/resolv.conf"), []byte("nameserver 10.1.2.3\n"), 0o644)
	os.WriteFile(filepath.Join(root, "run/systemd/resolve/resolv.conf"), []byte("# No DNS servers known.\n"), 0o644)
	r := runOneCheck(t, Config{Root: root}, "resolvers")
	if r.Verdict != Warn || !strings.Contains(r.Summary, "systemd-resolved has no uplink servers") {
		t.Errorf("%s %q %q", r.Verdict, r.Summary, r.Evidence)
	}
}
