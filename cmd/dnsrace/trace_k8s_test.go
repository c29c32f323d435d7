package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/dnsrace/dnsrace/internal/lab"
	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/podinfo"
	"github.com/dnsrace/dnsrace/internal/podinfo/podtest"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

func TestByteSize(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "512K": 512 << 10, "100M": 100 << 20, "1G": 1 << 30, "2mb": 2 << 20, "0": 0} {
		var b byteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("%q: %d %v, want %d", in, b, err, want)
		}
	}
	for _, in := range []string{"", "-1", "12Q", "M"} {
		var b byteSize
		if err := b.Set(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

// TestRotatingFile: the file rotates once to PATH.1 (replacing an older
// one) and never splits a write.
func TestRotatingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.jsonl")
	r, err := openRotating(path, 100)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Repeat("x", 39) + "\n" // 40 bytes
	for i := 0; i < 7; i++ {
		if _, err := io.WriteString(r, fmt.Sprintf("%d%s", i, line[1:])); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	cur, _ := os.ReadFile(path)
	old, _ := os.ReadFile(path + ".1")
	// 0,1 | 2,3 | 4,5 | 6: the current file holds 6, .1 holds 4 and 5.
	if string(cur) != "6"+line[1:] || string(old) != "4"+line[1:]+"5"+line[1:] {
		t.Errorf("current %q, .1 %q", cur, old)
	}
	// Appends to an existing file and counts its size.
	r, err = openRotating(path, 100)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(r, "7"+line[1:])
	_, _ = io.WriteString(r, "8"+line[1:])
	r.Close()
	cur, _ = os.ReadFile(path)
	old, _ = os.ReadFile(path + ".1")
	if !strings.HasPrefix(string(cur), "8") || !strings.HasPrefix(string(old), "6") {
		t.Errorf("after reopening: current %q, .1 %q", cur, old)
	}
}

func TestTraceBadOutputFlags(t *testing.T) {
	for _, args := range [][]string{
		{"trace", "--output-max-size", "1M"},
		{"trace", "--output-file", "/tmp/x", "--output-max-size", "100"},
		{"trace", "--output-file", "/tmp/x", "--output-max-size", "12Q"},
		{"trace", "--progress", "sometimes"},
		{"trace", "--metrics-pod-labels"},
		{"trace", "--metrics-addr", ":9153", "--metrics-max-pods", "0"},
		{"trace", "--pcap", "/tmp/same", "--output-file", "/tmp/same"},
	} {
		r := runBin(t, 10*time.Second, args...)
		if r.code != 2 || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line", args, r.code, r.stderr)
		}
	}
}

// TestDaemonSetArgs parses the DaemonSet's command line with the real flag
// set, so the manifest cannot drift from the flags.
func TestDaemonSetArgs(t *testing.T) {
	b, err := os.ReadFile("../../scripts/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(b, &ds); err != nil {
		t.Fatal(err)
	}
	c := ds.Spec.Template.Spec.Containers[0]
	if c.Args[0] != "trace" {
		t.Fatalf("args %v", c.Args)
	}
	var f traceFlags
	fs := pflag.NewFlagSet("trace", pflag.ContinueOnError)
	f.register(fs)
	if err := fs.Parse(c.Args[1:]); err != nil {
		t.Fatalf("the DaemonSet's args %v: %v", c.Args, err)
	}
	if err := f.checkOutputFlags(); err != nil {
		t.Errorf("the DaemonSet's args %v: %v", c.Args, err)
	}
	// Every flag path it passes is mounted.
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = true
	}
	if !mounts[f.procRoot] || !mounts[filepath.Join(f.root, "var/log/pods")] || !mounts[filepath.Join(f.root, "sys/fs/cgroup")] {
		t.Errorf("--proc-root %s / --root %s not backed by mounts %v", f.procRoot, f.root, mounts)
	}
	if c.SecurityContext.Capabilities == nil || len(c.SecurityContext.Capabilities.Add) == 0 {
		t.Error("no capabilities")
	}
}

// daemonSetCaps are the capabilities the DaemonSet grants, for setpriv.
func daemonSetCaps(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../scripts/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(b, &ds); err != nil {
		t.Fatal(err)
	}
	var caps []string
	for _, c := range ds.Spec.Template.Spec.Containers[0].SecurityContext.Capabilities.Add {
		caps = append(caps, "+"+strings.ToLower(string(c)))
	}
	return "-all," + strings.Join(caps, ",")
}

// TestTraceBinaryKubernetes runs the binary as the DaemonSet runs it (only
// the manifest's capabilities, --root over a node-like tree, --json,
// --metrics-addr) plus --pcap and --output-file, against a standing
// rule-drop lab whose pod0 has a long-lived process in a kubelet-named
// cgroup: one lookup, a scrape while it runs, SIGTERM, then the file, the
// pcap (tcpdump) and the metrics are checked.
func TestTraceBinaryKubernetes(t *testing.T) {
	testutil.RequireRoot(t)
	for _, tool := range []string{"setpriv", "tcpdump"} {
		if _, err := exec.LookPath(tool); err != nil {
			testutil.SkipOrFail(t, tool+" is not installed")
		}
	}
	const prefix = "dnsrace-e7"
	defer assertClean(t, prefix)
	if r := runBin(t, 60*time.Second, "lab", "up", "--scenario", "rule-drop", "--prefix", prefix); r.code != 0 {
		t.Fatalf("lab up: %s", r.stderr)
	}
	defer runBin(t, 60*time.Second, "lab", "down", "--prefix", prefix)

	root := kubeletPod(t, prefix+"-pod0")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	ready, outFile, pcap := filepath.Join(dir, "ready"), filepath.Join(dir, "out.jsonl"), filepath.Join(dir, "out.pcapng")
	var stdout, stderr bytes.Buffer
	tr := exec.Command("setpriv", "--bounding-set="+daemonSetCaps(t), "--",
		dnsraceBin, "trace", "--json", "--metrics-addr="+addr, "--root="+root, "--progress=never",
		"--pcap", pcap, "--output-file", outFile, "--output-max-size", "100M", "--ready-file", ready)
	tr.Stdout, tr.Stderr = &stdout, &stderr
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, tr, ready, &stderr)
	look := exec.Command(dnsraceBin, nsutil.ExecHelperArg, prefix+"-pod0", "--", "getent", "ahosts", lab.QName(0))
	t0 := time.Now()
	lookErr := look.Run()
	// The client's own measure: the lookup waited out a resolver timeout.
	if took := time.Since(t0); took < stallAtLeast {
		tr.Process.Kill()
		tr.Wait()
		t.Fatalf("the lookup took %v (%v), less than a resolver timeout: the firewall dropped nothing to attribute", took, lookErr)
	}
	// The incident is out once the retry's attempt is answered and the
	// next tick has written it: scrape until it is counted (or 10 s).
	var body []byte
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			tr.Process.Kill()
			tr.Wait()
			t.Fatalf("scraping: %v; stderr %s", err, stderr.String())
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), `dnsrace_incidents_total{cause="rule_drop"} 0`) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = tr.Process.Signal(syscall.SIGTERM)
	if err := tr.Wait(); err != nil {
		t.Fatalf("trace exited with %v: %s", err, stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout not empty with --output-file: %q", stdout.String())
	}
	metrics := string(body)
	for _, want := range []string{`dnsrace_incidents_total{cause="rule_drop"}`, `dnsrace_probes{hook="kfree_skb",tier="tracepoint"} 1`, "dnsrace_events_lost_total 0", "dnsrace_stall_seconds_bucket"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q:\n%s", want, metrics)
		}
	}
	if strings.Contains(metrics, `dnsrace_incidents_total{cause="rule_drop"} 0`) {
		t.Errorf("no rule_drop incident counted by the scrape:\n%s", metrics)
	}

	f, err := os.Open(outFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	podNS, _ := nsutil.Inode(prefix + "-pod0")
	var ours []map[string]any
	summary := false
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var obj map[string]any
		if err := json.Unmarshal(sc.Bytes(), &obj); err != nil {
			t.Fatalf("not JSON Lines: %q", sc.Text())
		}
		if obj["type"] == "summary" {
			summary = true
		}
		if obj["type"] == "incident" && uint32(obj["netns"].(float64)) == podNS {
			ours = append(ours, obj)
		}
	}
	if !summary || len(ours) == 0 {
		t.Fatalf("summary %v, %d incidents in pod0; stderr %s", summary, len(ours), stderr.String())
	}
	for _, inc := range ours {
		if inc["pod"] != "checkout-7f9c" || inc["namespace"] != "shop" {
			t.Errorf("incident %v: want pod shop/checkout-7f9c", inc)
		}
	}
	dump, err := exec.Command("tcpdump", "-nr", pcap).CombinedOutput()
	if err != nil {
		t.Fatalf("tcpdump: %v\n%s", err, dump)
	}
	inc := ours[0]
	lost := inc["lost"].([]any)[0].(map[string]any)
	want := fmt.Sprintf("%s > %s: %d+ AAAA? %s", dotted(inc["src"].(string)), dotted(inc["dst"].(string)), int(lost["id"].(float64)), lab.QName(0))
	if !strings.Contains(string(dump), want) {
		t.Errorf("tcpdump lacks %q:\n%s", want, dump)
	}
}

func dotted(addrPort string) string {
	i := strings.LastIndexByte(addrPort, ':')
	return strings.Trim(addrPort[:i], "[]") + "." + addrPort[i+1:]
}

// TestHostViewWarning: a fake /host/proc whose pid 1 is in another PID
// namespace (a real one, made for the test) triggers the warning; one in
// ours does not, nor does an explicit --proc-root.
func TestHostViewWarning(t *testing.T) {
	testutil.RequireRoot(t)
	other := exec.Command("sleep", "60")
	other.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Pdeathsig: syscall.SIGKILL}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
	mk := func(target string) string {
		dir := filepath.Join(t.TempDir(), "host", "proc")
		if err := os.MkdirAll(filepath.Join(dir, "1/ns"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(dir, "1/ns/pid")); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	foreign := mk(fmt.Sprintf("/proc/%d/ns/pid", other.Process.Pid))
	if w := hostViewWarning("/proc", "/", foreign); !strings.Contains(w, "--proc-root "+foreign) || !strings.Contains(w, "--root "+filepath.Dir(foreign)) {
		t.Errorf("foreign PID namespace: warning %q", w)
	}
	if w := hostViewWarning(foreign, "/", foreign); w != "" {
		t.Errorf("--proc-root given: warning %q", w)
	}
	if w := hostViewWarning("/proc", "/", mk("/proc/self/ns/pid")); w != "" {
		t.Errorf("same PID namespace: warning %q", w)
	}
	if w := hostViewWarning("/proc", "/", "/nonexistent/proc"); w != "" {
		t.Errorf("no /host/proc: warning %q", w)
	}
}

// TestTraceProgress: on a terminal (script(1) gives the binary a pty) the
// progress line is drawn on stderr and cleared before the summary; piped,
// there is none. --duration ends both with the summary.
func TestTraceProgress(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("script"); err != nil {
		testutil.SkipOrFail(t, "script(1) is not installed (util-linux)")
	}
	out, err := exec.Command("script", "-qfec", dnsraceBin+" trace --duration 2500ms", "/dev/null").CombinedOutput()
	if err != nil {
		t.Fatalf("trace on a pty: %v\n%q", err, out)
	}
	s := string(out)
	draw := strings.Index(s, "\r\x1b[Ktracing ")
	sum := strings.Index(s, "summary after")
	if draw < 0 || sum < draw || !strings.Contains(s, " DNS queries (") || !strings.Contains(s, " lost") {
		t.Errorf("no progress line before the summary on a pty:\n%q", s)
	}
	if lastDraw, clear := strings.LastIndex(s[:sum], "\r\x1b[Ktracing "), strings.LastIndex(s[:sum], "\r\x1b[K"); clear <= lastDraw {
		t.Errorf("progress line not cleared before the summary:\n%q", s)
	}
	r := runBin(t, 30*time.Second, "trace", "--duration", "1500ms")
	if r.code != 0 || strings.Contains(r.stderr, "\x1b[K") || !strings.Contains(r.stdout, "summary after") {
		t.Errorf("piped: exit %d, stderr %q, stdout %q", r.code, r.stderr, r.stdout)
	}
}

// kubeletPod makes netns look like a kubelet pod shop/checkout-7f9c
// (container app) on a node-like root it returns: a long-lived process in
// the namespace, in a kubelet-named cgroup, the kubelet's log folders under
// the root, and root/sys/fs/cgroup pointing at the real cgroup v2 mount.
// Everything goes when the test ends.
func kubeletPod(t *testing.T, netns string) string {
	t.Helper()
	root := t.TempDir()
	cgRoot := podinfo.New(podinfo.Config{}).CgroupRoot()
	if err := os.MkdirAll(filepath.Join(root, "sys/fs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(cgRoot, filepath.Join(root, "sys/fs/cgroup")); err != nil {
		t.Fatal(err)
	}
	node, err := podtest.NewNode(cgRoot, root)
	if err != nil {
		t.Fatal(err)
	}
	pause := exec.Command(dnsraceBin, nsutil.ExecHelperArg, netns, "--", "sleep", "600")
	if err := pause.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = pause.Process.Kill()
		_ = pause.Wait()
		if err := node.Close(); err != nil {
			t.Error(err)
		}
	})
	if _, err := node.AddPod("shop", "checkout-7f9c", "app", pause.Process.Pid); err != nil {
		t.Fatal(err)
	}
	return root
}
