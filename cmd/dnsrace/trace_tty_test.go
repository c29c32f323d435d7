package main

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/lab"
	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// TestTraceTerminal runs `dnsrace trace` in a real terminal (a tmux pane)
// against the snat-port lab, as an operator would: the first line says what
// is traced and that it waits, the progress line is drawn and redrawn, a
// stall is a headline with indented details, and Ctrl-C ends with the
// summary.
func TestTraceTerminal(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("tmux"); err != nil {
		testutil.SkipOrFail(t, "tmux is not installed (scripts/install-deps installs it)")
	}
	prefix := fmt.Sprintf("dnsrace-tt%d", time.Now().UnixNano()%10000)
	defer assertClean(t, prefix)
	if r := runBin(t, 60*time.Second, "lab", "up", "--scenario", "snat-port", "--prefix", prefix); r.code != 0 {
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
	// waits, before any DNS.
	waitFor("the tracing line", 30*time.Second, func(s string) bool {
		return regexp.MustCompile(`(?m)^dnsrace: tracing DNS port 53, every netns \(tracepoint: xmit recv copy drop ct-free rcvbuf\); waiting for stalls, Ctrl-C to stop$`).MatchString(s)
	})
	// The time is a Go duration: 59s, then 1m0s (a CI run waited 100 s
	// for its stall).
	progress := regexp.MustCompile(`tracing ((?:\d+h)?(?:\d+m)?\d+s): \d+ DNS queries \(\d+ answered, \d+ waiting\), \d+ stalls, \d+ races rescued; \d+ records read, 0 lost`)
	first := waitFor("the progress line", 5*time.Second, progress.MatchString)
	firstSecs := progress.FindStringSubmatch(first)[1]

	// Lookups in every pod until one stalls on the SNAT port race.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := 0; i < 4; i++ {
		go func() {
			for ctx.Err() == nil {
				_ = exec.CommandContext(ctx, dnsraceBin, nsutil.ExecHelperArg, fmt.Sprintf("%s-pod%d", prefix, i), "--", "getent", "ahosts", lab.QName(i)).Run()
			}
		}()
	}
	headline := regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d\.\d{3}  insert_race/reply_clash\s+stalled \d+\.\d s\s+netns \d+  svc-0\d\.lab\.test AA?A?A?$`)
	// The race needs both CPUs at one instant: a busy machine has gone
	// 40 s without one (1,440 lookups, no stall; a CI run).
	s := waitFor("a stall's headline", 120*time.Second, headline.MatchString)
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
		if len(labels) < 3 || labels[0] != "lost" || !contains(labels, "query") || !contains(labels, "retry") {
			t.Errorf("details under %q: %v\n%s", l, labels, s)
		}
		if len(l) > 120 {
			t.Errorf("headline of %d characters: %q", len(l), l)
		}
		break
	}
	// The progress line moved on (it is redrawn in place; a capture can
	// fall between its erase and its redraw, as one in CI did).
	waitFor("the progress line, redrawn", 5*time.Second, func(s string) bool {
		m := progress.FindAllStringSubmatch(s, -1)
		return len(m) > 0 && m[len(m)-1][1] != firstSecs
	})
	tmux("send-keys", "-t", session, "C-c")
	waitFor("the summary", 20*time.Second, func(s string) bool {
		return strings.Contains(s, "summary after") && strings.Contains(s, "lookups that waited out a resolver timeout:")
	})
}
