package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/dnsrace/dnsrace/internal/doctor"
)

const fixtures = "../../internal/doctor/testdata/"

func doctorRun(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := doctorMain(context.Background(), args, &out, &errb)
	return out.String(), err
}

func exitOf(err error) int {
	var ec exitCodeError
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ec):
		return ec.code
	case errors.As(err, &ue):
		return 2
	}
	return 1
}

func TestDoctorExitCodes(t *testing.T) {
	out, err := doctorRun(t, "--root", fixtures+"flatcar-azure-bridge")
	if exitOf(err) != 1 {
		t.Errorf("broken node: exit %d (%v)", exitOf(err), err)
	}
	if !strings.Contains(out, `[FAIL] resolvers        /etc/resolv.conf has no nameserver ("No DNS servers known.")`) {
		t.Errorf("text output:\n%s", out)
	}
	if !strings.Contains(out, "fix: ") {
		t.Errorf("no fix lines:\n%s", out)
	}
	if _, err := doctorRun(t, "--root", fixtures+"healthy"); exitOf(err) != 0 {
		t.Errorf("healthy node: exit %d (%v)", exitOf(err), err)
	}
	for _, bad := range [][]string{
		{"--bogus"},
		{"--root", "/nonexistent-dnsrace"},
		{"--root", fixtures + "healthy", "--check", "nope"},
		{"--root", fixtures + "healthy", "--netns", "/run/netns/x"},
		{"--live", "--no-live"},
		{"extra"},
		{"--iptables-save", "/nonexistent-dnsrace"},
	} {
		if _, err := doctorRun(t, bad...); exitOf(err) != 2 {
			t.Errorf("%q: exit %d (%v), want 2", bad, exitOf(err), err)
		}
	}
}

func TestDoctorJSON(t *testing.T) {
	out, err := doctorRun(t, "--root", fixtures+"flatcar-azure-bridge", "--json")
	if exitOf(err) != 1 {
		t.Errorf("exit %d", exitOf(err))
	}
	var doc struct {
		Checks []struct {
			ID       string   `json:"id"`
			Verdict  string   `json:"verdict"`
			Summary  string   `json:"summary"`
			Evidence []string `json:"evidence"`
			Fix      string   `json:"fix"`
			Reason   string   `json:"reason"`
		} `json:"checks"`
		Exit int `json:"exit"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	if doc.Exit != 1 || len(doc.Checks) != len(doctor.CheckIDs()) {
		t.Errorf("exit %d, %d checks", doc.Exit, len(doc.Checks))
	}
	got := map[string]string{}
	for _, c := range doc.Checks {
		got[c.ID] = c.Verdict
		if c.Evidence == nil {
			t.Errorf("%s: evidence is null, want a list", c.ID)
		}
	}
	if got["resolvers"] != "fail" || got["bridge-takeover"] != "fail" || got["kernel-fix"] != "fail" {
		t.Errorf("verdicts %v", got)
	}
}

func TestDoctorHelp(t *testing.T) {
	out, err := doctorRun(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Usage: dnsrace doctor", "--root", "--netns", "--json", "Examples:", "kubectl debug node", "Exit status"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

// Through main's run: the exit statuses a shell sees.
func TestDoctorThroughRun(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"doctor", "--root", fixtures + "flatcar-azure-bridge", "--json"}, 1},
		{[]string{"doctor", "--root", fixtures + "healthy"}, 0},
		{[]string{"doctor", "--no-such-flag"}, 2},
		{[]string{"doctor", "--help"}, 0},
	} {
		if got := run(tc.args); got != tc.want {
			t.Errorf("dnsrace %s: exit %d, want %d", strings.Join(tc.args, " "), got, tc.want)
		}
	}
}
