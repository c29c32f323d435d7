package doctor

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runFixture runs every check against a fixture root, files only.
func runFixture(t *testing.T, root string) map[string]Result {
	t.Helper()
	rep, err := Run(context.Background(), Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Result{}
	for _, r := range rep.Checks {
		out[r.ID] = r
	}
	if len(out) != len(allChecks) {
		t.Fatalf("got %d results, want %d", len(out), len(allChecks))
	}
	return out
}

func wantVerdict(t *testing.T, rs map[string]Result, id string, v Verdict, evidence ...string) Result {
	t.Helper()
	r := rs[id]
	if r.Verdict != v {
		t.Errorf("%s: verdict %s, want %s (summary %q, reason %q, evidence %q)", id, r.Verdict, v, r.Summary, r.Reason, r.Evidence)
	}
	all := r.Summary + "\n" + strings.Join(r.Evidence, "\n")
	for _, e := range evidence {
		if !strings.Contains(all, e) {
			t.Errorf("%s: evidence lacks %q:\n%s", id, e, all)
		}
	}
	if (v == Warn || v == Fail) && r.Fix == "" {
		t.Errorf("%s: %s without a fix", id, v)
	}
	if v == Skip && r.Reason == "" {
		t.Errorf("%s: skip without a reason", id)
	}
	return r
}

// The seed's broken node: Flatcar 2605 (kernel 5.4), Azure CNI in bridge
// mode, eth0 moved into azure0, Flatcar's catch-all zz-default.network
// managing everything, resolved's uplink file empty.
func TestFlatcarAzureBridge(t *testing.T) {
	rs := runFixture(t, "testdata/flatcar-azure-bridge")
	wantVerdict(t, rs, "resolvers", Fail,
		`/etc/resolv.conf has no nameserver ("No DNS servers known.")`,
		"/etc/resolv.conf -> ../run/systemd/resolve/resolv.conf")
	r := wantVerdict(t, rs, "bridge-takeover", Fail,
		"eth0 is enslaved to bridge azure0",
		"/sys/class/net/eth0/master -> azure0",
		"/etc/cni/net.d/10-azure.conflist: type=azure-vnet mode=bridge bridge=azure0",
		"default route via azure0",
		"azure0: managed by /usr/lib/systemd/network/zz-default.network",
		"azv894be745adc: managed by",
		"eth0: managed by /etc/systemd/network/10-eth0.network [Name=eth0, DHCP=yes]")
	if !strings.Contains(r.Fix, "Unmanaged=true") || !strings.Contains(r.Fix, "transparent") {
		t.Errorf("bridge-takeover fix %q", r.Fix)
	}
	wantVerdict(t, rs, "conntrack", Warn, "insert_failed=41 drop=41", "host cpu1: insert_failed=41 drop=41", "3121/131072")
	wantVerdict(t, rs, "kernel-fix", Fail, "5.4.66-flatcar",
		"different DNAT backends (random DNAT, kube-dns VIP): DROPS", "release 5.4 < 5.6")
	wantVerdict(t, rs, "kube-proxy", Warn, "random over 2 endpoints", "KUBE-SVC-TCOU7JCQXEZGVUNU",
		"nat/KUBE-POSTROUTING MASQUERADE without --random-fully")
	wantVerdict(t, rs, "stale-nat", Warn, "10.240.0.27:53 (host)",
		"host: udp 10.240.0.44:53318 -> 10.0.0.10:53 still goes to 10.240.0.27:53",
		"not a current backend (10.240.0.12:53, 10.240.0.31:53)",
		"delete: conntrack -D -p udp --orig-src 10.240.0.44 --orig-port-src 53318 --orig-dst 10.0.0.10 --orig-port-dst 53")
	wantVerdict(t, rs, "pod-resolvers", Warn, "2 musl container(s) rely on single-request-reopen, which musl ignores",
		"pid 1234 (nginx), pid 3456 (traefik)", "glibc, nameserver 10.0.0.10, options ndots:5")
	wantVerdict(t, rs, "tracing", Fail, "no kernel BTF", "CONFIG_KPROBES=y", "/sys/kernel/btf/vmlinux: absent")
}

func TestHealthy(t *testing.T) {
	rs := runFixture(t, "testdata/healthy")
	for _, id := range CheckIDs() {
		if rs[id].Verdict != OK {
			t.Errorf("%s: %s, want ok: %s %s %q", id, rs[id].Verdict, rs[id].Summary, rs[id].Reason, rs[id].Evidence)
		}
	}
	wantVerdict(t, rs, "resolvers", OK, "stub 127.0.0.53 with 1 uplink server(s): 168.63.129.16")
	wantVerdict(t, rs, "bridge-takeover", OK, "mode=transparent", "uplink eth0")
	wantVerdict(t, rs, "kube-proxy", OK, "NodeLocal DNSCache", "MASQUERADE fully random")
	wantVerdict(t, rs, "conntrack", OK, "clash_resolve=25")
	wantVerdict(t, rs, "kernel-fix", OK, "[BTF: enum ip_conntrack_status has IPS_NAT_CLASH_BIT]", "clash_resolve counter available")
	wantVerdict(t, rs, "tracing", OK, "kprobe tier or better")
	wantVerdict(t, rs, "stale-nat", OK, "2 UDP conntrack entries to DNS VIPs, all going to current backends",
		"host: 10.0.0.10:53/udp DNATs to 10.240.0.12:53, 10.240.0.31:53")
	rep, _ := Run(context.Background(), Config{Root: "testdata/healthy"})
	if rep.Exit != 0 {
		t.Errorf("exit %d", rep.Exit)
	}
}

// An empty root: nothing to read, so every check must skip with a reason.
func TestEmptyRootSkipsEverything(t *testing.T) {
	rs := runFixture(t, t.TempDir())
	for _, id := range CheckIDs() {
		if rs[id].Verdict != Skip {
			t.Errorf("%s: %s on an empty root, want skip: %s %q", id, rs[id].Verdict, rs[id].Summary, rs[id].Evidence)
		}
		if rs[id].Reason == "" {
			t.Errorf("%s: skip without reason", id)
		}
	}
}

// copyTree copies a fixture root, keeping symbolic links as links.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(l, to)
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, b, 0o644)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// Unreadable or malformed inputs turn what would be ok into skip with the
// reason; they never crash a check and never produce a false ok.
func TestMalformedInputsSkip(t *testing.T) {
	for _, tc := range []struct {
		name   string
		check  string
		mutate func(root string) error
		reason string
	}{
		{"conflist not JSON", "bridge-takeover", func(r string) error {
			return os.WriteFile(filepath.Join(r, "etc/cni/net.d/10-azure.conflist"), []byte(`{"plugins":[{"type":"azure-vnet",`), 0o644)
		}, "parsing /etc/cni/net.d/10-azure.conflist"},
		{"conflist without type", "bridge-takeover", func(r string) error {
			return os.WriteFile(filepath.Join(r, "etc/cni/net.d/10-azure.conflist"), []byte(`{"name":"x"}`), 0o644)
		}, "neither"},
		{"network file garbage", "bridge-takeover", func(r string) error {
			return os.WriteFile(filepath.Join(r, "etc/systemd/network/10-eth0.network"), []byte("[Match\nName=eth0\n"), 0o644)
		}, "bad section line"},
		{"route header wrong", "bridge-takeover", func(r string) error {
			return os.WriteFile(filepath.Join(r, "proc/net/route"), []byte("garbage\n"), 0o644)
		}, "/proc/net/route"},
		{"resolv.conf is a directory", "resolvers", func(r string) error {
			p := filepath.Join(r, "run/systemd/resolve/stub-resolv.conf")
			if err := os.Remove(p); err != nil {
				return err
			}
			return os.Mkdir(p, 0o755)
		}, "is a directory"},
		{"resolv.conf binary", "resolvers", func(r string) error {
			return os.WriteFile(filepath.Join(r, "run/systemd/resolve/stub-resolv.conf"), []byte("nameserver 127.0.0.53\n\x00\x01"), 0o644)
		}, "NUL"},
		{"uplink list unreadable", "resolvers", func(r string) error {
			p := filepath.Join(r, "run/systemd/resolve/resolv.conf")
			if err := os.Remove(p); err != nil {
				return err
			}
			return os.Mkdir(p, 0o755)
		}, "uplink list is unreadable"},
		{"resolv.conf link loop", "resolvers", func(r string) error {
			p := filepath.Join(r, "etc/resolv.conf")
			os.Remove(p)
			return os.Symlink("/etc/resolv.conf", p)
		}, "too many levels"},
		{"conntrack stat not hex", "conntrack", func(r string) error {
			return os.WriteFile(filepath.Join(r, "proc/net/stat/nf_conntrack"),
				[]byte("entries insert_failed drop\nzz 00 00\n"), 0o644)
		}, "not hex"},
		{"conntrack stat short header", "conntrack", func(r string) error {
			return os.WriteFile(filepath.Join(r, "proc/net/stat/nf_conntrack"), []byte("entries found\n0 0\n"), 0o644)
		}, "no \"insert_failed\" column"},
		{"conntrack max unreadable", "conntrack", func(r string) error {
			return os.WriteFile(filepath.Join(r, "proc/sys/net/netfilter/nf_conntrack_max"), []byte("lots\n"), 0o644)
		}, "nf_conntrack_max"},
		{"osrelease garbage", "kernel-fix", func(r string) error {
			return os.WriteFile(filepath.Join(r, "proc/sys/kernel/osrelease"), []byte("linux\n"), 0o644)
		}, "osrelease"},
		{"iptables dump is a directory", "kube-proxy", func(r string) error {
			p := filepath.Join(r, "var/lib/dnsrace/iptables-save.txt")
			os.Remove(p)
			return os.Mkdir(p, 0o755)
		}, "is a directory"},
		{"iptables dump empty", "kube-proxy", func(r string) error {
			return os.WriteFile(filepath.Join(r, "var/lib/dnsrace/iptables-save.txt"), []byte("# nothing\n"), 0o644)
		}, "has no rules"},
		{"conntrack dump garbled", "stale-nat", func(r string) error {
			return os.WriteFile(filepath.Join(r, "var/lib/dnsrace/conntrack.txt"), []byte("udp 17 29 src=10.240.0.44 dst=\n"), 0o644)
		}, "1 line(s) not understood"},
		{"conntrack dump missing", "stale-nat", func(r string) error {
			return os.Remove(filepath.Join(r, "var/lib/dnsrace/conntrack.txt"))
		}, "no conntrack entries to read"},
		{"rules only in an nft dump", "stale-nat", func(r string) error {
			if err := os.Remove(filepath.Join(r, "var/lib/dnsrace/iptables-save.txt")); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(r, "var/lib/dnsrace/nft-ruleset.txt"), []byte("table ip kube-proxy {\n}\n"), 0o644)
		}, "only in an nft text dump"},
		{"pods resolv.conf unreadable", "pod-resolvers", func(r string) error {
			for _, pid := range []string{"4321", "4400", "4500"} {
				p := filepath.Join(r, "proc", pid, "root/etc/resolv.conf")
				os.Remove(p)
				if err := os.Mkdir(p, 0o755); err != nil {
					return err
				}
			}
			return nil
		}, "is a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := copyTree(t, "testdata/healthy")
			if err := tc.mutate(root); err != nil {
				t.Fatal(err)
			}
			rep, err := Run(context.Background(), Config{Root: root, Checks: []string{tc.check}})
			if err != nil {
				t.Fatal(err)
			}
			r := rep.Checks[0]
			if r.Verdict != Skip {
				t.Fatalf("verdict %s, want skip (summary %q evidence %q)", r.Verdict, r.Summary, r.Evidence)
			}
			if !strings.Contains(r.Reason, tc.reason) {
				t.Errorf("reason %q lacks %q", r.Reason, tc.reason)
			}
		})
	}
}

// A problem that is found stays a problem even when another input is
// unreadable: the unreadable one is added as evidence.
func TestFailSurvivesUnreadableInput(t *testing.T) {
	root := copyTree(t, "testdata/flatcar-azure-bridge")
	if err := os.WriteFile(filepath.Join(root, "etc/cni/net.d/10-azure.conflist"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, _ := Run(context.Background(), Config{Root: root, Checks: []string{"bridge-takeover"}})
	r := rep.Checks[0]
	if r.Verdict != Fail || !strings.Contains(strings.Join(r.Evidence, "\n"), "could not read: parsing /etc/cni/net.d/10-azure.conflist") {
		t.Errorf("got %s %q", r.Verdict, r.Evidence)
	}
}

// master as a symlink (real sysfs) and as a plain file (fixtures) both work.
func TestSysfsMasterForms(t *testing.T) {
	root := copyTree(t, "testdata/flatcar-azure-bridge")
	p := filepath.Join(root, "sys/class/net/eth0/master")
	os.Remove(p)
	if err := os.Symlink("../../../virtual/net/azure0", p); err != nil {
		t.Fatal(err)
	}
	rep, _ := Run(context.Background(), Config{Root: root, Checks: []string{"bridge-takeover"}})
	if r := rep.Checks[0]; r.Verdict != Fail {
		t.Errorf("symlinked master: %s %s", r.Verdict, r.Summary)
	}
}

// Bridge mode configured but no pod yet: the takeover is announced.
func TestBridgeModeBeforeFirstPod(t *testing.T) {
	root := copyTree(t, "testdata/flatcar-azure-bridge")
	os.Remove(filepath.Join(root, "sys/class/net/eth0/master"))
	os.RemoveAll(filepath.Join(root, "sys/class/net/azure0"))
	os.RemoveAll(filepath.Join(root, "sys/class/net/azv894be745adc"))
	route := "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\neth0\t00000000\t0100F00A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
	os.WriteFile(filepath.Join(root, "proc/net/route"), []byte(route), 0o644)
	rep, _ := Run(context.Background(), Config{Root: root, Checks: []string{"bridge-takeover"}})
	r := rep.Checks[0]
	if r.Verdict != Warn || !strings.Contains(r.Summary, "bridge mode") {
		t.Errorf("got %s %q %q", r.Verdict, r.Summary, r.Evidence)
	}
	// With the Unmanaged drop-in the same node is fine.
	os.WriteFile(filepath.Join(root, "etc/systemd/network/05-azure.network"),
		[]byte("[Match]\nName=azure0 azv*\n\n[Link]\nUnmanaged=yes\n"), 0o644)
	rep, _ = Run(context.Background(), Config{Root: root, Checks: []string{"bridge-takeover"}})
	if r := rep.Checks[0]; r.Verdict != OK {
		t.Errorf("with drop-in: %s %q %q", r.Verdict, r.Summary, r.Evidence)
	}
}

func TestUnknownCheck(t *testing.T) {
	if _, err := Run(context.Background(), Config{Root: t.TempDir(), Checks: []string{"nope"}}); err == nil {
		t.Error("want error")
	}
}

func removeAndLink(p, target string) error {
	os.Remove(p)
	return os.Symlink(target, p)
}
