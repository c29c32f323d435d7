package vmtest

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/report.golden")

func parseFile(t *testing.T, name string) *GuestLog {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := ParseConsole(f)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func cellOf(t *testing.T, g *GuestLog, tier, suite string) *Cell {
	t.Helper()
	for _, c := range g.Cells {
		if c.Tier == tier && c.Suite == suite {
			return c
		}
	}
	t.Fatalf("no cell %s %s in %v", tier, suite, g.Cells)
	return nil
}

func TestConsoleCells(t *testing.T) {
	g := parseFile(t, "6.1@fentry.log")
	if g.Label() != "6.1" || g.Uname != "6.1.0-57-cloud-amd64" || g.BootSeconds != "2.95" || !g.Done || g.Note() != "done" {
		t.Errorf("guest: label %q uname %q boot %q done %v note %q", g.Label(), g.Uname, g.BootSeconds, g.Done, g.Note())
	}
	var got []string
	for _, c := range g.Cells {
		got = append(got, c.Tier+"/"+c.Suite+"="+c.Status)
	}
	// the plan's cells of this guest's tier, in plan order
	want := []string{"fentry/probe=pass", "fentry/trace=fail", "fentry/runs=pass"}
	if !slices.Equal(got, want) {
		t.Errorf("cells %v, want %v", got, want)
	}
	probe := cellOf(t, g, "fentry", "probe")
	if probe.Passed != 1 || probe.Skipped != 1 || probe.Seconds != 41 {
		t.Errorf("probe: passed %d skipped %d seconds %d", probe.Passed, probe.Skipped, probe.Seconds)
	}
}

func TestFailedCellToFailedTests(t *testing.T) {
	g := parseFile(t, "6.1@fentry.log")
	c := cellOf(t, g, "fentry", "trace")
	if c.Status != "fail" || c.RC != 1 || c.Note != "rc=1,seconds=210" {
		t.Errorf("trace: status %s rc %d note %s", c.Status, c.RC, c.Note)
	}
	if want := []string{"TestTraceSNATPort/reconcile", "TestTraceSNATPort"}; !slices.Equal(c.FailedTests, want) {
		t.Errorf("failed tests %v, want %v", c.FailedTests, want)
	}
	if c.Passed != 1 || c.Failed != 1 {
		t.Errorf("top-level passed %d failed %d, want 1 and 1", c.Passed, c.Failed)
	}
	// the output keeps the test's words and a kernel message between its events
	out := strings.Join(c.Output, "\n")
	for _, s := range []string{"3 queries neither answered nor dropped: live", "nf_conntrack: table full", "--- FAIL: TestTraceSNATPort (30.10s)"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
}

func TestConsoleTimeoutAndCrash(t *testing.T) {
	g := parseFile(t, "6.1@kprobe+tracepoint+any.log")
	if g.Note() != "timeout" {
		t.Errorf("note %q, want timeout", g.Note())
	}
	for _, w := range []struct{ tier, suite, status, note string }{
		{"kprobe", "probe", "pass", "rc=0,seconds=30"},
		{"tracepoint", "probe", "fail", "timeout"}, // started, never ended
		{"any", "lab", "fail", "timeout"},          // never started
	} {
		if c := cellOf(t, g, w.tier, w.suite); c.Status != w.status || c.Note != w.note {
			t.Errorf("%s %s: %s (%s), want %s (%s)", w.tier, w.suite, c.Status, c.Note, w.status, w.note)
		}
	}
	g = parseFile(t, "7.2.log")
	if c := cellOf(t, g, "kprobe", "probe"); c.Status != "fail" || c.Note != "no-result" {
		t.Errorf("crashed guest's cell: %s (%s), want fail (no-result)", c.Status, c.Note)
	}
	if want := "Oops: int3: 0000 at kmem_cache_free+0xaf/0x3f0"; g.Crash != want {
		t.Errorf("crash %q, want %q", g.Crash, want)
	}
}

func TestConsoleRuns(t *testing.T) {
	g := parseFile(t, "6.1@fentry.log")
	if len(g.Runs) != 2 {
		t.Fatalf("runs %+v, want 2 lines", g.Runs)
	}
	r := g.Runs[0]
	if r.Kernel != "6.1" || r.Tier != "fentry" || r.Case != "udp-forward" || r.Total != "4.00" ||
		r.NsPerUnit != "" || r.Accel != "tcg" || !slices.Equal(r.Progs, []string{"confirm=1.00", "kfree=0.001", "xmit=3.00"}) {
		t.Errorf("runs line without times %+v", r)
	}
	r = g.Runs[1]
	if r.Case != "dns-forward" || r.Total != "9.50" || r.NsPerUnit != "2613" ||
		!slices.Equal(r.Progs, []string{"confirm=2.00@150ns", "kfree=0.004@900ns", "xmit=7.50@308ns"}) {
		t.Errorf("runs line with times %+v", r)
	}
}

// A console line cut by a kernel message is plain output, not an event.
func TestConsoleBrokenEvent(t *testing.T) {
	log := "VMTEST-PLAN {\"kernel\":\"k\",\"tiers\":[\"any\"],\"suites\":[{\"name\":\"s\",\"tiers\":[\"any\"]}]}\n" +
		"VMTEST-CELL tier=any suite=s\n" +
		"{\"Action\":\"pass\",\"Test\":\"TestA\"}\n" +
		"{\"Action\":\"fail\",\"Te[   9.1] random: crng init done\n" +
		"VMTEST-END tier=any suite=s rc=1 seconds=3\n"
	g, err := ParseConsole(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	c := cellOf(t, g, "any", "s")
	if c.Status != "fail" || c.Passed != 1 || len(c.Output) != 1 {
		t.Errorf("cell %+v", c)
	}
}

func testReport(t *testing.T) *Report {
	rep := &Report{TotalSeconds: 1534}
	for _, n := range []string{"6.1@fentry.log", "6.1@kprobe+tracepoint+any.log", "7.2.log"} {
		rep.Guests = append(rep.Guests, parseFile(t, n))
	}
	return rep
}

func TestReportGolden(t *testing.T) {
	rep := testReport(t)
	var b bytes.Buffer
	rep.Write(&b)
	golden := filepath.Join("testdata", "report.golden")
	if *update {
		if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if b.String() != string(want) {
		t.Errorf("report differs from %s (go test -update to rewrite it):\n%s", golden, b.String())
	}
	if !rep.Failed() {
		t.Error("a report with failed cells is not Failed")
	}
}

func TestReportJSON(t *testing.T) {
	var b bytes.Buffer
	if err := testReport(t).WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var j JSON
	if err := json.Unmarshal(b.Bytes(), &j); err != nil {
		t.Fatal(err)
	}
	if len(j.Kernels) != 3 || len(j.Cells) != 7 {
		t.Fatalf("%d kernels, %d cells; want 3 and 7", len(j.Kernels), len(j.Cells))
	}
	k := j.Kernels[2]
	if k.Kernel != "7.2" || len(k.Parts) != 2 || k.WallSeconds == nil || *k.WallSeconds != 41.5 || k.Crash == "" {
		t.Errorf("kernel 7.2: %+v", k)
	}
	c := j.Cells[1]
	if c.Suite != "trace" || c.Status != "fail" || len(c.FailedTests) != 2 {
		t.Errorf("cell %+v", c)
	}
}

func TestReportNothingRan(t *testing.T) {
	if !(&Report{}).Failed() {
		t.Error("a report with no cells is not Failed")
	}
}

func TestDecodeConsole(t *testing.T) {
	in := "VMTEST-CELL tier=any suite=s\n" +
		"{\"Action\":\"run\",\"Test\":\"TestA\"}\n" +
		"{\"Action\":\"output\",\"Test\":\"TestA\",\"Output\":\"=== RUN   TestA\\n\"}\n" +
		"{\"Action\":\"output\",\"Test\":\"TestA\",\"Output\":\"    a_test.go:9: DNSRACE-SURVEY-JSON {\\\"k\\\":1}\\n\"}\n" +
		"[   9.1] random: crng init done\n" +
		"VMTEST-END tier=any suite=s rc=0 seconds=3\n"
	var b strings.Builder
	if err := DecodeConsole(strings.NewReader(in), &b); err != nil {
		t.Fatal(err)
	}
	want := "VMTEST-CELL tier=any suite=s\n=== RUN   TestA\n    a_test.go:9: DNSRACE-SURVEY-JSON {\"k\":1}\n[   9.1] random: crng init done\nVMTEST-END tier=any suite=s rc=0 seconds=3\n"
	if b.String() != want {
		t.Errorf("decoded:\n%s\nwant:\n%s", b.String(), want)
	}
}
