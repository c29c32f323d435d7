package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/lab"
	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// waitReady waits up to 30 s for the tracer's --ready-file; it kills the
// tracer and fails the test when the file does not come.
func waitReady(t *testing.T, tr *exec.Cmd, ready string, stderr fmt.Stringer) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			return
		}
		if time.Now().After(deadline) {
			tr.Process.Kill()
			tr.Wait()
			t.Fatalf("no ready file after 30s: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stallAtLeast is how long a lookup that waited out glibc's default 5 s
// resolver timeout takes at the least, as measured around getent.
const stallAtLeast = 4900 * time.Millisecond

func TestTraceBadInput(t *testing.T) {
	for _, args := range [][]string{
		{"trace", "--port", "0"},
		{"trace", "--attach", "uprobe"},
		{"trace", "--ring-buffer-size", "1000"},
		{"trace", "--reader-nice", "30"},
		{"trace", "--netns", "/nonexistent/ns"},
		{"trace", "--kernel-btf", "/nonexistent.btf"},
	} {
		r := runBin(t, 10*time.Second, args...)
		if r.code != 2 || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line", args, r.code, r.stderr)
		}
	}
}

// TestTraceBinaryRuleDrop runs the real binary against a standing lab: it
// waits for --ready-file, makes one glibc lookup whose AAAA the node's
// firewall drops, stops the tracer with SIGTERM and reads its JSON Lines.
func TestTraceBinaryRuleDrop(t *testing.T) {
	testutil.RequireRoot(t)
	const prefix = "dnsrace-e5"
	defer assertClean(t, prefix)
	if r := runBin(t, 60*time.Second, "lab", "up", "--scenario", "rule-drop", "--prefix", prefix); r.code != 0 {
		t.Fatalf("lab up: %s", r.stderr)
	}
	defer runBin(t, 60*time.Second, "lab", "down", "--prefix", prefix)

	ready := filepath.Join(t.TempDir(), "ready")
	var out, errb bytes.Buffer
	tr := exec.Command(dnsraceBin, "trace", "--json", "--ready-file", ready)
	tr.Stdout, tr.Stderr = &out, &errb
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, tr, ready, &errb)
	// glibc: A answered, AAAA dropped, a wait of glibc's default 5 s
	// timeout (the lab's resolv.conf sets no options), a retry.
	look := exec.Command(dnsraceBin, nsutil.ExecHelperArg, prefix+"-pod0", "--", "getent", "ahosts", lab.QName(0))
	t0 := time.Now()
	lookErr := look.Run()
	took := time.Since(t0)
	// The client's own measure first: the lookup waited out a timeout.
	if took < stallAtLeast {
		tr.Process.Kill()
		tr.Wait()
		t.Fatalf("the lookup took %v (%v), less than a resolver timeout: the firewall dropped nothing to attribute", took, lookErr)
	}
	// The reconciliation on demand, then the end.
	_ = tr.Process.Signal(syscall.SIGUSR1)
	time.Sleep(500 * time.Millisecond)
	_ = tr.Process.Signal(syscall.SIGTERM)
	if err := tr.Wait(); err != nil {
		t.Fatalf("trace exited with %v: %s", err, errb.String())
	}
	var incidents []map[string]any
	var summary, checkpoint map[string]any
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var obj map[string]any
		if err := json.Unmarshal(sc.Bytes(), &obj); err != nil {
			t.Fatalf("not JSON Lines: %q: %v", sc.Text(), err)
		}
		switch obj["type"] {
		case "incident":
			incidents = append(incidents, obj)
		case "summary":
			summary = obj
		case "checkpoint":
			checkpoint = obj
		default:
			t.Errorf("object without a known type: %v", obj)
		}
	}
	if summary == nil {
		t.Fatalf("no summary object; stderr %s", errb.String())
	}
	if checkpoint == nil {
		t.Errorf("no checkpoint object after SIGUSR1")
	} else if _, ok := checkpoint["kernel"]; !ok {
		t.Errorf("checkpoint lacks the kernel counters: %v", checkpoint)
	}
	for _, k := range []string{"incidents", "kernel", "attributed", "events_lost", "probes"} {
		if _, ok := summary[k]; !ok {
			t.Errorf("summary lacks %q", k)
		}
	}
	podNS, _ := nsutil.Inode(prefix + "-pod0")
	var ours []map[string]any
	for _, inc := range incidents {
		if uint32(inc["netns"].(float64)) == podNS {
			ours = append(ours, inc)
		}
	}
	if len(ours) == 0 {
		t.Fatalf("lookup took %v but no incident in the pod's netns %d; output:\n%s", took, podNS, out.String())
	}
	for _, inc := range ours {
		for _, k := range []string{"cause", "race", "qname", "qtype", "netns", "src", "dst", "stall_ms", "sibling", "winner", "tier"} {
			if _, ok := inc[k]; !ok {
				t.Errorf("incident lacks %q: %v", k, inc)
			}
		}
		if inc["cause"] != "rule_drop" || inc["qtype"] != "AAAA" || inc["qname"] != strings.TrimSuffix(lab.QName(0), ".") {
			t.Errorf("incident %v: want rule_drop of AAAA %s", inc, lab.QName(0))
		}
	}
}
