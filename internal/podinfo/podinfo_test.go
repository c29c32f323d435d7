package podinfo_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/podinfo"
	"github.com/dnsrace/dnsrace/internal/podinfo/podtest"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

func TestParseCgroupPath(t *testing.T) {
	id := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, c := range []struct {
		path, uid, cid string
		ok             bool
	}{
		{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_0000_1111_2222_333344445555.slice/cri-containerd-" + id + ".scope",
			"1a2b3c4d-0000-1111-2222-333344445555", id, true},
		{"/kubepods.slice/kubepods-pod1a2b3c4d_0000_1111_2222_333344445555.slice/crio-" + id + ".scope",
			"1a2b3c4d-0000-1111-2222-333344445555", id, true},
		{"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b3c4d_0000_1111_2222_333344445555.slice/docker-" + id + ".scope",
			"1a2b3c4d-0000-1111-2222-333344445555", id, true},
		{"/kubepods/burstable/pod1a2b3c4d-0000-1111-2222-333344445555/" + id,
			"1a2b3c4d-0000-1111-2222-333344445555", id, true},
		{"/kubepods/pod1a2b3c4d-0000-1111-2222-333344445555/" + id,
			"1a2b3c4d-0000-1111-2222-333344445555", id, true},
		// The pod's own slice: the pod, no container.
		{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_0000_1111_2222_333344445555.slice",
			"1a2b3c4d-0000-1111-2222-333344445555", "", true},
		{"/kubepods.slice/kubepods-burstable.slice", "", "", false},
		{"/system.slice/containerd.service", "", "", false},
		{"/user.slice/user-1000.slice/session-2.scope", "", "", false},
		{"/", "", "", false},
	} {
		uid, cid, ok := podinfo.ParseCgroupPath(c.path)
		if uid != c.uid || cid != c.cid || ok != c.ok {
			t.Errorf("%s: got %q %q %v, want %q %q %v", c.path, uid, cid, ok, c.uid, c.cid, c.ok)
		}
	}
}

// TestFixtureProc resolves through a fixture /proc and log tree under
// prefixes, as in a kubectl debug pod (/host/proc, /host).
func TestFixtureProc(t *testing.T) {
	root := t.TempDir()
	proc := filepath.Join(root, "proc")
	id := "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	uid := "aaaabbbb-cccc-dddd-eeee-ffff00001111"
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// pid 4242: cgroupfs driver, v1 hierarchies only (an older node).
	write(filepath.Join(proc, "4242/cgroup"), "12:pids:/kubepods/burstable/pod"+uid+"/"+id+"\n1:name=systemd:/kubepods/burstable/pod"+uid+"/"+id+"\n")
	write(filepath.Join(proc, "4242/comm"), "coredns\n")
	// pid 7: the host's own process.
	write(filepath.Join(proc, "7/cgroup"), "0::/system.slice/kubelet.service\n")
	write(filepath.Join(proc, "7/comm"), "kubelet\n")
	if err := os.MkdirAll(filepath.Join(root, "var/log/pods/kube-system_coredns-5d78c9869d-x7k2p_"+uid+"/coredns"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(root, "var/log/containers/coredns-5d78c9869d-x7k2p_kube-system_coredns-"+id+".log"), "")
	// Both fixture processes point at real namespaces so inodes resolve:
	// 4242 at this process's, and "1" makes that the host's.
	for _, pid := range []string{"4242", "1"} {
		if err := os.MkdirAll(filepath.Join(proc, pid, "ns"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/proc/self/ns/net", filepath.Join(proc, pid, "ns/net")); err != nil {
			t.Fatal(err)
		}
	}
	r := podinfo.New(podinfo.Config{ProcRoot: proc, Root: root, CgroupRoot: t.TempDir()})
	p, ok := r.ByPID(4242)
	want := podinfo.Pod{Namespace: "kube-system", Name: "coredns-5d78c9869d-x7k2p", UID: uid, Container: "coredns", ContainerID: id, PID: 4242, Comm: "coredns"}
	if !ok || p != want {
		t.Errorf("pid 4242: %+v %v, want %+v", p, ok, want)
	}
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	// The namespace holds pid 4242, a pod's: it is the pod's even though
	// it is also "pid 1's".
	if p, ok := r.ByNetNS(uint32(st.Ino)); !ok || p.UID != uid {
		t.Errorf("netns %d: %+v %v, want pod %s", st.Ino, p, ok, uid)
	}
	// A host process in the host namespace.
	if p, ok := r.Lookup(uint32(st.Ino), 7, 0); !ok || !p.Host || p.Comm != "kubelet" || p.PID != 7 {
		t.Errorf("host pid 7: %+v %v, want host kubelet[7]", p, ok)
	}
	if p, ok := r.ByPID(99999); ok {
		t.Errorf("missing pid resolved to %+v", p)
	}
}

// TestNotAPodCached: a process in no pod is read once per TTL, not once
// per lookup (a flood of lost queries from one process asks for it at
// every incident); a gone process is not cached.
func TestNotAPodCached(t *testing.T) {
	proc := t.TempDir()
	cg := filepath.Join(proc, "5/cgroup")
	if err := os.MkdirAll(filepath.Dir(cg), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(cg, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	uid := "aaaabbbb-cccc-dddd-eeee-ffff00001111"
	podPath := "0::/kubepods.slice/kubepods-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice\n"
	for _, c := range []struct {
		ttl  time.Duration
		want bool // the second lookup sees the process's new cgroup
	}{{time.Hour, false}, {time.Nanosecond, true}} {
		write("0::/user.slice/user-1000.slice/session-2.scope\n")
		r := podinfo.New(podinfo.Config{ProcRoot: proc, Root: t.TempDir(), CgroupRoot: t.TempDir(), TTL: c.ttl})
		if p, ok := r.ByPID(5); ok {
			t.Fatalf("ttl %v: pid 5 in no pod resolved to %+v", c.ttl, p)
		}
		write(podPath)
		if p, ok := r.ByPID(5); ok != c.want || (ok && p.UID != uid) {
			t.Errorf("ttl %v: after the move %+v %v, want found=%v", c.ttl, p, ok, c.want)
		}
	}
	// Gone, then there: a pid that could not be read is asked again.
	r := podinfo.New(podinfo.Config{ProcRoot: proc, Root: t.TempDir(), CgroupRoot: t.TempDir(), TTL: time.Hour})
	if _, ok := r.ByPID(6); ok {
		t.Fatal("pid 6 does not exist")
	}
	if err := os.MkdirAll(filepath.Join(proc, "6"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "6/cgroup"), []byte(podPath), 0o644); err != nil {
		t.Fatal(err)
	}
	if p, ok := r.ByPID(6); !ok || p.UID != uid {
		t.Errorf("pid 6 once it exists: %+v %v, want pod %s", p, ok, uid)
	}
}

// TestRealCgroup puts a process in its own network namespace into a cgroup
// named as the kubelet names it, and resolves it by namespace, pid and
// cgroup id, on the real kernel.
func TestRealCgroup(t *testing.T) {
	testutil.RequireRoot(t)
	cgRoot := podinfo.New(podinfo.Config{}).CgroupRoot()
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(cgRoot, &sfs); err != nil || sfs.Type != 0x63677270 {
		testutil.SkipOrFail(t, "no cgroup v2 mount at "+cgRoot)
	}
	root := t.TempDir()
	node, err := podtest.NewNode(cgRoot, root)
	if err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("sleep", "60")
	sleeper.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sleeper.Process.Kill()
		_ = sleeper.Wait()
		if err := node.Close(); err != nil {
			t.Error(err)
		}
	})
	pid := sleeper.Process.Pid
	pod, err := node.AddPod("shop", "checkout-7f9c", "app", pid)
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join("/proc", strconv.Itoa(pid), "ns/net"), &st); err != nil {
		t.Fatal(err)
	}
	netns := uint32(st.Ino)
	if err := syscall.Stat(pod.Cgroup, &st); err != nil {
		t.Fatal(err)
	}
	cgid := st.Ino
	r := podinfo.New(podinfo.Config{Root: root, CgroupRoot: cgRoot, TTL: time.Second})
	want := podinfo.Pod{Namespace: "shop", Name: "checkout-7f9c", UID: pod.UID, Container: "app", ContainerID: pod.ContainerID}
	check := func(how string, p podinfo.Pod, ok bool) {
		t.Helper()
		p.PID, p.Comm = 0, ""
		if !ok || p != want {
			t.Errorf("by %s: %+v %v, want %+v", how, p, ok, want)
		}
	}
	p, ok := r.ByNetNS(netns)
	check("netns", p, ok)
	if p.PID != uint32(pid) || p.Comm != "sleep" {
		t.Errorf("by netns: resolved through %s[%d], want sleep[%d]", p.Comm, p.PID, pid)
	}
	p, ok = r.ByPID(uint32(pid))
	check("pid", p, ok)
	p, ok = r.ByCgroup(cgid)
	check("cgroup id", p, ok)
	// A short-lived process of the pod gone by now: the namespace still
	// names the pod.
	p, ok = r.Lookup(netns, 1<<22-1, 0)
	check("netns after the pid is gone", p, ok)
	// This test's own process is the host's, in no pod.
	self := uint32(os.Getpid())
	if err := syscall.Stat("/proc/1/ns/net", &st); err != nil {
		// A sandbox that hides pid 1: the resolver takes its own.
		if err := syscall.Stat("/proc/self/ns/net", &st); err != nil {
			t.Fatal(err)
		}
	}
	if p, ok := r.Lookup(uint32(st.Ino), self, 0); !ok || !p.Host || p.UID != "" {
		t.Errorf("this test's process: %+v %v, want host", p, ok)
	}
}

// FuzzParseCgroupPath: any /proc/<pid>/cgroup path parses without
// panicking, and a UID found has no underscore left and a container ID is
// 64 hex digits.
func FuzzParseCgroupPath(f *testing.F) {
	f.Add("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_0000_1111_2222_333344445555.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope")
	f.Add("/kubepods/burstable/pod1a2b3c4d-0000-1111-2222-333344445555/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
	f.Add("/../../kubepods-pod_.slice")
	f.Add("/")
	f.Fuzz(func(t *testing.T, path string) {
		uid, cid, ok := podinfo.ParseCgroupPath(path)
		if !ok {
			if uid != "" || cid != "" {
				t.Fatalf("%q: not ok but %q %q", path, uid, cid)
			}
			return
		}
		if uid == "" || strings.Contains(uid, "_") {
			t.Fatalf("%q: uid %q", path, uid)
		}
		if cid != "" && len(cid) != 64 {
			t.Fatalf("%q: container id %q", path, cid)
		}
	})
}

// BenchmarkLookupNotAPod: the lookup each incident of a flood from outside
// any pod makes (dnsrace bench's), once its three caches hold the answer.
func BenchmarkLookupNotAPod(b *testing.B) {
	proc := b.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "5"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "5/cgroup"), []byte("0::/user.slice/session-2.scope\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	r := podinfo.New(podinfo.Config{ProcRoot: proc, Root: b.TempDir(), CgroupRoot: b.TempDir(), TTL: time.Hour})
	b.ReportAllocs()
	for b.Loop() {
		if p, ok := r.Lookup(4026532001, 5, 77); ok {
			b.Fatalf("resolved to %+v", p)
		}
	}
}
