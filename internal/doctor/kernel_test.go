package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// writeBTF puts a raw BTF blob holding types at root/sys/kernel/btf/vmlinux.
func writeBTF(t *testing.T, root string, types ...btf.Type) {
	t.Helper()
	b, err := btf.NewBuilder(types, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := b.Marshal(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "sys/kernel/btf")
	os.MkdirAll(dir, 0o755)
	if err := os.WriteFile(filepath.Join(dir, "vmlinux"), raw, 0o444); err != nil {
		t.Fatal(err)
	}
}

// A 4.15 Azure kernel whose BTF carries the 5.6 clash code (a backport) is
// judged by its BTF, not its release number; and kallsyms is read from the
// root too.
func TestKernelFixBTFFromRoot(t *testing.T) {
	root := copyTree(t, "testdata/flatcar-azure-bridge")
	os.WriteFile(filepath.Join(root, "proc/sys/kernel/osrelease"), []byte("4.15.0-1030-azure\n"), 0o644)
	writeBTF(t, root, &btf.Enum{Name: "ip_conntrack_status", Size: 4, Values: []btf.EnumValue{
		{Name: "IPS_EXPECTED_BIT", Value: 0}, {Name: "IPS_NAT_CLASH_BIT", Value: 12}}})
	os.WriteFile(filepath.Join(root, "proc/kallsyms"), []byte("ffffffffc0a1b000 t nf_ct_resolve_clash\t[nf_conntrack]\n"), 0o444)
	r := runOneCheck(t, Config{Root: root}, "kernel-fix")
	ev := strings.Join(r.Evidence, "\n")
	if r.Verdict != OK || !strings.Contains(ev, "resolved: inserted reply-only (IPS_NAT_CLASH, 1 s) [BTF: enum ip_conntrack_status has IPS_NAT_CLASH_BIT]") ||
		!strings.Contains(ev, "kallsyms: nf_ct_resolve_clash is out of line") {
		t.Errorf("%s %q\n%s", r.Verdict, r.Summary, ev)
	}
	// The same BTF without the bit: the release said 5.10, BTF says no.
	writeBTF(t, root, &btf.Enum{Name: "ip_conntrack_status", Size: 4, Values: []btf.EnumValue{{Name: "IPS_EXPECTED_BIT"}}})
	os.WriteFile(filepath.Join(root, "proc/sys/kernel/osrelease"), []byte("5.10.0-8-amd64\n"), 0o644)
	r = runOneCheck(t, Config{Root: root}, "kernel-fix")
	if r.Verdict != Fail {
		t.Errorf("%s %q %q", r.Verdict, r.Summary, r.Evidence)
	}
	// Garbage where BTF should be: reported, classification by release.
	os.WriteFile(filepath.Join(root, "sys/kernel/btf/vmlinux"), []byte("not BTF"), 0o444)
	r = runOneCheck(t, Config{Root: root}, "kernel-fix")
	if r.Verdict != OK || !strings.Contains(strings.Join(r.Evidence, "\n"), "/sys/kernel/btf/vmlinux: loading") {
		t.Errorf("%s %q %q", r.Verdict, r.Summary, r.Evidence)
	}
}

// tracefs mounted without kprobe_events means no kprobes, whatever the
// config says is unknown; without BTF that leaves nothing to attach.
func TestTracingNoKprobesNoBTF(t *testing.T) {
	root := copyTree(t, "testdata/healthy")
	os.Remove(filepath.Join(root, "boot/config-5.15.0-1052-azure"))
	os.Remove(filepath.Join(root, "sys/kernel/btf/vmlinux"))
	os.MkdirAll(filepath.Join(root, "sys/kernel/tracing"), 0o755)
	os.WriteFile(filepath.Join(root, "sys/kernel/tracing/available_events"), []byte("skb:kfree_skb\n"), 0o444)
	r := runOneCheck(t, Config{Root: root}, "tracing")
	if r.Verdict != Fail || !strings.Contains(strings.Join(r.Evidence, "\n"), "mounted but has no kprobe_events") {
		t.Errorf("%s %q %q", r.Verdict, r.Summary, r.Evidence)
	}
	// lockdown=confidentiality refuses kprobes even when configured; with
	// BTF the answer then hangs on a live fentry trial.
	root = copyTree(t, "testdata/healthy")
	os.WriteFile(filepath.Join(root, "sys/kernel/security/lockdown"), []byte("none integrity [confidentiality]\n"), 0o444)
	r = runOneCheck(t, Config{Root: root}, "tracing")
	if r.Verdict != Skip || !strings.Contains(r.Reason, "kprobes no") ||
		!strings.Contains(strings.Join(r.Evidence, "\n"), "lockdown=confidentiality") {
		t.Errorf("%s %q %q %q", r.Verdict, r.Summary, r.Reason, r.Evidence)
	}
}

// The tracepoint tier's summary says how merged clash losers are seen as
// internal/probe sees them on that kernel: a netfilter program just before
// confirm from 6.4, the loser's entry freed before.
func TestMergedLosersSeenByRelease(t *testing.T) {
	for _, c := range []struct{ release, want, not string }{
		{"6.18.44-fc-v657", "netfilter program just before confirm", "freed"},
		{"6.4.0", "netfilter program just before confirm", "freed"},
		{"6.1.0-57-cloud-amd64", "unconfirmed entries freed (kmem_cache_free)", "netfilter"},
		{"5.10.0-35-amd64", "unconfirmed entries freed (kmem_cache_free)", "netfilter"},
		{"", "before 6.4 by their unconfirmed entries freed", ""},
	} {
		got := mergedLosersSeen(c.release)
		if !strings.Contains(got, c.want) || (c.not != "" && strings.Contains(got, c.not)) {
			t.Errorf("release %q: %q; want %q, not %q", c.release, got, c.want, c.not)
		}
	}
}
