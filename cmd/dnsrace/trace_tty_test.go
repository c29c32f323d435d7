package main

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/lab"
	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// TestTraceTerminal runs `dnsrace trace` in a real terminal (a tmux pane)
// against the rule-drop lab, as an operator would: the first line says what
// is traced and that it waits, the progress line is drawn and redrawn, a
// stall is a headline with indented details, and Ctrl-C ends with the
// summary. The lab's rule drops every AAAA query, so the first lookup
// stalls: a race would make the test wait on chance (with snat-port
// minutes may pass without one). The race incidents'
// text is checked by the writers' golden files and the trace suites.
func TestTraceTerminal(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("tmux"); err != nil {
		testutil.SkipOrFail(t, "tmux is not installed (scripts/install-deps installs it)")
	}
	prefix := fmt.Sprintf("dnsrace-tt%d", time.Now().UnixNano()%10000)
	defer assertClean(t, prefix)
	sc, err := lab.LookupScenario("rule-drop")
	if err != nil {
		t.Fatal(err)
	}
	if r := runBin(t, 60*time.Second, "lab", "up", "--scenario", sc.Name, "--prefix", prefix); r.code != 0 {
		t.Fatalf("lab up: %s", r.stderr)
	}
	defer runBin(t, 60*time.Second, "lab", "down", "--prefix", prefix)

	session := prefix
	tmux := func(args ...string) string {
		out, err := exec.Command("tmux", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	tmux("new-session", "-d", "-s", session, "-x", "200", "-y", "60", dnsraceBin+" trace; sleep 30")
	defer exec.Command("tmux", "kill-session", "-t", session).Run()
	screen := func() string { return tmux("capture-pane", "-p", "-t", session, "-S", "-200") }
	waitFor := func(what string, within time.Duration, ok func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			s := screen()
			if ok(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not on the terminal within %v:\n%s", what, within, s)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// A quiet node: the tracer says at once what it traces and that it
	// waits, before any DNS. Merged clash losers are seen just before
	// confirm (pre-confirm, 6.4+) or, before 6.4, by their freed entry
	// (ct-free).
	waitFor("the tracing line", 30*time.Second, func(s string) bool {
		return regexp.MustCompile(`(?m)^dnsrace: tracing DNS port 53, every netns \(tracepoint: (pre-confirm )?xmit recv drop (ct-free )?rcvbuf\); waiting for stalls, Ctrl-C to stop$`).MatchString(s)
	})
	// The time is a Go duration: 59s, then 1m0s.
	progress := regexp.MustCompile(`tracing ((?:\d+h)?(?:\d+m)?\d+s): \d+ DNS queries \(\d+ answered, \d+ waiting\), \d+ stalls, \d+ races rescued; \d+ records read, 0 lost`)
	first := waitFor("the progress line", 5*time.Second, progress.MatchString)
	firstSecs := progress.FindStringSubmatch(first)[1]

	// Lookups in every pod: each stalls on its AAAA query.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := 0; i < sc.Pods; i++ {
		go func() {
			for ctx.Err() == nil {
				_ = exec.CommandContext(ctx, dnsraceBin, nsutil.ExecHelperArg, fmt.Sprintf("%s-pod%d", prefix, i), "--", "getent", "ahosts", lab.QName(i)).Run()
			}
		}()
	}
	// glibc gives a lookup up after its third attempt: its stall is at
	// least the time to that attempt (no retry ends it).
	headline := regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d\.\d{3}  rule_drop\s+stalled ≥?\d+\.\d s\s+netns \d+  svc-0\d\.lab\.test AAAA$`)
	// The stall is written when it ends: its lookup's next attempt found
	// nothing lost, or QueryTTL after its last attempt.
	s := waitFor("a stall's headline", 60*time.Second, headline.MatchString)
	cancel()
	// The headline is followed by indented details, each label once.
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if !headline.MatchString(l) {
			continue
		}
		var labels []string
		for _, d := range lines[i+1:] {
			if !strings.HasPrefix(d, "    ") {
				break
			}
			labels = append(labels, strings.Fields(d)[0])
		}
		// A retry line where a retry of the lookup ended the stall; a
		// lookup that gave up has none (another lookup's query is not
		// its retry).
		retried := !strings.Contains(l, "≥")
		if len(labels) < 3 || labels[0] != "lost" || !slices.Contains(labels, "query") || slices.Contains(labels, "retry") != retried {
			t.Errorf("details under %q: %v\n%s", l, labels, s)
		}
		if len(l) > 120 {
			t.Errorf("headline of %d characters: %q", len(l), l)
		}
		break
	}
	// The progress line moved on (it is redrawn in place; a capture can
	// fall between its erase and its redraw).
	waitFor("the progress line, redrawn", 5*time.Second, func(s string) bool {
		m := progress.FindAllStringSubmatch(s, -1)
		return len(m) > 0 && m[len(m)-1][1] != firstSecs
	})
	tmux("send-keys", "-t", session, "C-c")
	waitFor("the summary", 20*time.Second, func(s string) bool {
		return strings.Contains(s, "summary after") && strings.Contains(s, "lookups that waited out a resolver timeout:")
	})
}
