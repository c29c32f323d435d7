package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image"
	_ "image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/lab"
	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// leftovers lists everything a lab with prefix may leave behind: what
// lab.Leftovers finds, and processes started for it (namespace helpers,
// getent, the detached DNS backends).
func leftovers(prefix string) []string {
	left := lab.Leftovers(prefix)
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmd, nsutil.ExecHelperArg+" "+prefix+"-") || strings.Contains(cmd, "--prefix "+prefix+" ") || strings.HasSuffix(cmd, "--prefix "+prefix+" ") {
			left = append(left, "process "+cmd)
		}
	}
	return left
}

// udpOutDatagrams reads the UDP datagrams namespace ns has sent (Udp
// OutDatagrams of /proc/net/snmp, read through thread-self: /proc/self/net
// is the namespace of the process's main thread).
func udpOutDatagrams(ns string) (uint64, error) {
	var raw []byte
	err := nsutil.Do(ns, func() (err error) {
		raw, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	})
	if err != nil {
		return 0, err
	}
	var names []string
	for _, l := range strings.Split(string(raw), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = f[1:]
			continue
		}
		for i, n := range names {
			if n == "OutDatagrams" && i+1 < len(f) {
				return strconv.ParseUint(f[i+1], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no Udp OutDatagrams in /proc/net/snmp of %s", ns)
}

func assertClean(t *testing.T, prefix string) {
	t.Helper()
	// Killed processes may take a moment to be reaped by their parent.
	var left []string
	for i := 0; i < 40; i++ {
		if left = leftovers(prefix); len(left) == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("left behind: %v", left)
	_ = lab.Teardown(prefix)
}

func TestLabBadInput(t *testing.T) {
	cases := [][]string{
		{"lab", "run", "--scenario", "no-such"},
		{"lab", "run", "--scenario", "snat-port", "--pods", "0"},
		{"lab", "run", "--scenario", "snat-port", "--snat-ports", "2000-1000"},
		{"lab", "run", "--scenario", "snat-port", "--resolver", "bind9"},
		{"lab", "run"},
		{"lab", "run", "--scenario", "snat-port", "--no-such-flag"},
		{"lab", "survey", "--iterations", "0"},
		{"lab", "survey", "--resolver", "bind9"},
		{"lab", "frobnicate"},
	}
	for _, args := range cases {
		r := runBin(t, 10*time.Second, args...)
		lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
		if r.code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", args, r.code, r.stderr)
		}
		if args[len(args)-1] != "--no-such-flag" && len(lines) != 1 {
			t.Errorf("%v: want a one-line error, got %q", args, r.stderr)
		}
	}
}

func TestLabNotRoot(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		testutil.SkipOrFail(t, "setpriv (util-linux) not installed")
	}
	cmd := exec.Command("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", dnsraceBin, "lab", "run", "--scenario", "snat-port")
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "needs root") || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
		t.Fatalf("as nobody: %v, output %q; want exit 2 and a one-line 'needs root'", err, out)
	}
}

func TestLabUpTwiceAndDown(t *testing.T) {
	testutil.RequireRoot(t)
	const prefix = "dnsrace-e1"
	defer assertClean(t, prefix)
	r := runBin(t, 60*time.Second, "lab", "up", "--scenario", "snat-port", "--prefix", prefix)
	if r.code != 0 {
		t.Fatalf("lab up: exit %d: %s", r.code, r.stderr)
	}
	r2 := runBin(t, 60*time.Second, "lab", "up", "--scenario", "snat-port", "--prefix", prefix)
	if r2.code == 0 || !strings.Contains(r2.stderr, "already up") {
		t.Errorf("second lab up: exit %d, stderr %q; want a clear 'already up' error", r2.code, r2.stderr)
	}
	// The first lab must still be whole: a real lookup through it works.
	out, err := exec.Command(dnsraceBin, nsutil.ExecHelperArg, prefix+"-pod0", "--", "getent", "ahosts", lab.QName(0)).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "192.0.2.53") {
		t.Errorf("lookup in the standing lab: %v: %s", err, out)
	}
	if r := runBin(t, 60*time.Second, "lab", "down", "--prefix", prefix); r.code != 0 {
		t.Fatalf("lab down: exit %d: %s", r.code, r.stderr)
	}
}

func TestLabInterruptLeavesNothing(t *testing.T) {
	testutil.RequireRoot(t)
	// snat-port NATs on the node; local-out-snat in every pod's namespace.
	for _, sc := range []string{"snat-port", "local-out-snat"} {
		t.Run(sc, func(t *testing.T) {
			const prefix = "dnsrace-e2"
			defer assertClean(t, prefix)
			cmd := exec.Command(dnsraceBin, "lab", "run", "--scenario", sc, "--duration", "60s", "--prefix", prefix)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			// Interrupt mid-run, once pod 0 has sent queries (its kernel's
			// count): lookups are in flight.
			sent := uint64(0)
			for deadline := time.Now().Add(30 * time.Second); sent == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if nsutil.Exists(prefix + "-pod0") {
					sent, _ = udpOutDatagrams(prefix + "-pod0")
				}
			}
			if sent == 0 {
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("pod0 sent no query within 30 s of lab run: nothing in flight to interrupt; stderr %q", stderr.String())
			}
			_ = cmd.Process.Signal(syscall.SIGINT)
			select {
			case err := <-done:
				if err == nil {
					t.Errorf("interrupted run exited 0")
				}
				// It ended through the interrupt, not another failure.
				if !strings.Contains(stderr.String(), "interrupted; the lab was torn down") {
					t.Errorf("interrupted run (%v, pod0 had sent %d datagrams): stderr %q, want the interrupt named", err, sent, stderr.String())
				}
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatal("lab run did not exit within 30s of SIGINT")
			}
		})
	}
}

func TestLabFailedStepLeavesNothing(t *testing.T) {
	testutil.RequireRoot(t)
	const prefix = "dnsrace-e3"
	// local-out-snat puts NAT rules and conntrack in every pod's namespace.
	for _, sc := range []string{"snat-port", "local-out-snat"} {
		for _, step := range []string{"namespaces", "links", "sysctls", "rules", "resolv.conf", "servers"} {
			r := runBin(t, 60*time.Second, "lab", "run", "--scenario", sc, "--prefix", prefix, "--fail-at-step", step)
			if r.code == 0 || !strings.Contains(r.stderr, "injected failure") {
				t.Errorf("%s, step %s: exit %d, stderr %q", sc, step, r.code, r.stderr)
			}
			assertClean(t, prefix)
		}
		// The same for a standing lab, failing once every rule is in.
		r := runBin(t, 60*time.Second, "lab", "up", "--scenario", sc, "--prefix", prefix, "--fail-at-step", "resolv.conf")
		if r.code == 0 {
			t.Errorf("%s: lab up with a failing step exited 0", sc)
		}
		assertClean(t, prefix)
	}
}

// TestLabNATLayouts: a standing lab of each layout answers a real glibc
// lookup, and conntrack entries appear where the scenario says the NAT is
// (the node, or the pod's own namespace) and nowhere else.
func TestLabNATLayouts(t *testing.T) {
	testutil.RequireRoot(t)
	for _, tc := range []struct {
		scenario string
		localNAT bool
	}{
		{"target-port", false}, // backends on 5353 behind the VIP's 53
		{"local-out", true},
		{"local-out-snat", true},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			const prefix = "dnsrace-e7"
			defer assertClean(t, prefix)
			if r := runBin(t, 60*time.Second, "lab", "up", "--scenario", tc.scenario, "--prefix", prefix); r.code != 0 {
				t.Fatalf("lab up: exit %d: %s", r.code, r.stderr)
			}
			defer func() {
				if r := runBin(t, 60*time.Second, "lab", "down", "--prefix", prefix); r.code != 0 {
					t.Errorf("lab down: exit %d: %s", r.code, r.stderr)
				}
			}()
			entries := func(ns string) uint32 {
				st, err := ctstats.Read(nsutil.Path(ns))
				if err != nil {
					t.Fatalf("reading conntrack of %s: %v", ns, err)
				}
				return st.Entries
			}
			// These scenarios time UDP entries out after 1 s: read the
			// counts right after a lookup, and look again if a slow moment
			// let them expire.
			var node, pod uint32
			for try := 0; try < 5; try++ {
				out, err := exec.Command(dnsraceBin, nsutil.ExecHelperArg, prefix+"-pod0", "--", "getent", "ahosts", lab.QName(0)).CombinedOutput()
				if err != nil || !strings.Contains(string(out), "192.0.2.53") {
					t.Fatalf("lookup in the standing lab: %v: %s", err, out)
				}
				if node, pod = entries(prefix+"-node"), entries(prefix+"-pod0"); node+pod > 0 {
					break
				}
			}
			if tc.localNAT && (pod == 0 || node != 0) {
				t.Errorf("NAT in the pod: conntrack entries node %d, pod %d; want 0 and > 0", node, pod)
			}
			if !tc.localNAT && (node == 0 || pod != 0) {
				t.Errorf("NAT on the node: conntrack entries node %d, pod %d; want > 0 and 0", node, pod)
			}
		})
	}
}

func TestLabClientCrashLeavesNothing(t *testing.T) {
	testutil.RequireRoot(t)
	const prefix = "dnsrace-e4"
	defer assertClean(t, prefix)
	r := runBin(t, 120*time.Second, "lab", "run", "--scenario", "upstream-loss", "--prefix", prefix,
		"--duration", "4s", "--crash-client-after", "1s", "--json")
	var rep lab.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("decoding report: %v (exit %d, stderr %q)", err, r.code, r.stderr)
	}
	if rep.Crashed < 1 {
		t.Errorf("clients_crashed = %d, want >= 1", rep.Crashed)
	}
}

// TestLabDownLeavesOtherLabs: tearing down lab "P" must not touch a lab
// whose prefix merely starts with "P-".
func TestLabDownLeavesOtherLabs(t *testing.T) {
	testutil.RequireRoot(t)
	const a, b = "dnsrace-e6", "dnsrace-e6-b"
	defer assertClean(t, b)
	for _, p := range []string{a, b} {
		if r := runBin(t, 60*time.Second, "lab", "up", "--scenario", "rule-drop", "--prefix", p); r.code != 0 {
			t.Fatalf("lab up %s: %s", p, r.stderr)
		}
	}
	if r := runBin(t, 60*time.Second, "lab", "down", "--prefix", a); r.code != 0 {
		t.Fatalf("lab down %s: %s", a, r.stderr)
	}
	for _, n := range []string{b + "-node", b + "-dns", b + "-pod0"} {
		if !nsutil.Exists(n) {
			t.Errorf("lab down %s removed %s", a, n)
		}
	}
	if _, err := os.Stat(filepath.Join(lab.StateDir, b+".json")); err != nil {
		t.Errorf("lab down %s removed %s's state: %v", a, b, err)
	}
	if left := leftovers(a); len(left) > 0 {
		var own []string
		for _, l := range left {
			if !strings.Contains(l, b) {
				own = append(own, l)
			}
		}
		if len(own) > 0 {
			t.Errorf("lab %s left behind: %v", a, own)
		}
	}
	if r := runBin(t, 60*time.Second, "lab", "down", "--prefix", b); r.code != 0 {
		t.Fatalf("lab down %s: %s", b, r.stderr)
	}
}

// TestLabComparePlot runs `lab compare --plot` on two survey files (format 2
// and format 1): the table has a column per file, the PNG decodes, and a
// bad plot name is a usage error.
func TestLabComparePlot(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.json")
	b := filepath.Join(dir, "b.json")
	if err := os.WriteFile(a, []byte(`{"version":2,"kernel":"6.18.44","cpus":2,"scenarios":[{"name":"snat-port","resolver":"glibc","stall_rate":0.1,
		"latency":{"p50_ms":1,"histogram":{"le_ms":[0.5,1,5012],"count":[10,80,10]}}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, []byte(`{"version":1,"kernel":"6.1.0-57-cloud-amd64","cpus":2,"scenarios":[{"name":"snat-port","stall_rate":0.2,"latency":{"p50_ms":2}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	png := filepath.Join(dir, "cmp.png")
	r := runBin(t, 30*time.Second, "lab", "compare", a, b, "--plot", png)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "6.18.44") || !strings.Contains(r.stdout, "6.1.0-57-cloud-amd64") || !strings.Contains(r.stdout, "+100%") {
		t.Errorf("table:\n%s", r.stdout)
	}
	f, err := os.Open(png)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, format, err := image.Decode(f); err != nil || format != "png" {
		t.Errorf("plot: %v, format %q", err, format)
	}
	for _, args := range [][]string{
		{"lab", "compare", a, b, "--plot", filepath.Join(dir, "cmp.pdf")},
		{"lab", "compare", a},
		{"lab", "compare", a, filepath.Join(dir, "missing.json")},
	} {
		if r := runBin(t, 30*time.Second, args...); r.code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", args, r.code, r.stderr)
		}
	}
}
