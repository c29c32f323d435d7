package podinfo_test

import (
	"strings"
	"testing"

	"github.com/dnsrace/dnsrace/internal/podinfo"
)

const ctrID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// FuzzCgroupPaths: any /proc/<pid>/cgroup text gives one path per
// "ID:controllers:path" line, each the text after the second colon.
func FuzzCgroupPaths(f *testing.F) {
	f.Add("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_0000_1111_2222_333344445555.slice/cri-containerd-" + ctrID + ".scope\n")
	f.Add("12:memory:/kubepods/burstable/pod1a2b3c4d-0000-1111-2222-333344445555/" + ctrID + "\n11:cpu,cpuacct:/kubepods/x\n1:name=systemd:/init.scope\n0::/\n")
	f.Add("0::/a:b:c\n::\nno colon\n")
	f.Fuzz(func(t *testing.T, text string) {
		paths := podinfo.CgroupPaths(strings.NewReader(text))
		lines := 0
		for _, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
			if strings.Count(l, ":") >= 2 {
				lines++
			}
		}
		if len(text) < 60<<10 && len(paths) != lines { // bufio's line limit aside
			t.Fatalf("%d paths from %d hierarchy lines", len(paths), lines)
		}
		for _, p := range paths {
			if !strings.Contains(text, p) {
				t.Fatalf("path %q is not in the text", p)
			}
			podinfo.ParseCgroupPath(p)
		}
	})
}

// FuzzParsePodLogDir: a /var/log/pods folder name splits into three
// non-empty parts without '_' that join back to the name, or is refused.
func FuzzParsePodLogDir(f *testing.F) {
	f.Add("kube-system_coredns-7db6d8ff4d-x2k8p_1a2b3c4d-0000-1111-2222-333344445555")
	f.Add("shop_checkout-7f9c_uid")
	f.Add("a__b")
	f.Add("_a_b")
	f.Fuzz(func(t *testing.T, dir string) {
		ns, name, uid, ok := podinfo.ParsePodLogDir(dir)
		if !ok {
			if ns != "" || name != "" || uid != "" {
				t.Fatalf("refused %q but returned %q %q %q", dir, ns, name, uid)
			}
			return
		}
		for _, s := range []string{ns, name, uid} {
			if s == "" || strings.Contains(s, "_") {
				t.Fatalf("%q: part %q", dir, s)
			}
		}
		if ns+"_"+name+"_"+uid != dir {
			t.Fatalf("%q split into %q %q %q", dir, ns, name, uid)
		}
	})
}

// FuzzParseContainerLog: a /var/log/containers symlink name gives the pod,
// namespace, container and the 64-character id it was built from.
func FuzzParseContainerLog(f *testing.F) {
	f.Add("checkout-7f9c_shop_app-" + ctrID + ".log")
	f.Add("coredns-7db6d8ff4d-x2k8p_kube-system_coredns-" + ctrID)
	f.Add("a_b_c-" + ctrID[:63] + ".log")
	f.Add("a_b_c_d-" + ctrID + ".log")
	f.Fuzz(func(t *testing.T, file string) {
		pod, ns, ctr, id, ok := podinfo.ParseContainerLog(file)
		if !ok {
			return
		}
		if len(id) != 64 {
			t.Fatalf("%q: id %q", file, id)
		}
		for _, s := range []string{pod, ns, ctr} {
			if s == "" || strings.Contains(s, "_") {
				t.Fatalf("%q: part %q", file, s)
			}
		}
		if got := pod + "_" + ns + "_" + ctr + "-" + id; got != strings.TrimSuffix(file, ".log") {
			t.Fatalf("%q split into %q", file, got)
		}
	})
}
