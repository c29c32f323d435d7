package main

import (
	"strings"
	"testing"
	"time"
)

// TestBenchBadInput: bad flags are refused before anything is built, with
// exit 2 and one line that says what is accepted.
func TestBenchBadInput(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--case", "no-such"}, "known: udp-forward, "},
		{[]string{"bench", "--duration", "0s"}, "must be positive"},
		{[]string{"bench", "--rounds", "0"}, "must be positive"},
		{[]string{"bench", "--rate", "1000,-5"}, "--rate -5"},
		{[]string{"bench", "--attach", "bogus"}, "want auto, fentry, kprobe or tracepoint"},
	}
	for _, c := range cases {
		r := runBin(t, 10*time.Second, c.args...)
		if r.code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", c.args, r.code, r.stderr)
		}
		if lines := strings.Split(strings.TrimSpace(r.stderr), "\n"); len(lines) != 1 || !strings.Contains(lines[0], c.want) {
			t.Errorf("%v: stderr %q, want one line containing %q", c.args, r.stderr, c.want)
		}
	}
}
