package overhead

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func TestBuildQuery(t *testing.T) {
	b := make([]byte, 64)
	buildQuery(b, 0xbeef, 0x2a)
	var m dns.Msg
	if err := m.Unpack(b[:dnsQueryLen]); err != nil {
		t.Fatalf("unpacking the flood's query: %v", err)
	}
	if m.Id != 0xbeef || m.Response || len(m.Question) != 1 {
		t.Fatalf("header: %+v", m.MsgHdr)
	}
	q := m.Question[0]
	if q.Name != "q0000002a.perf.test." || q.Qtype != dns.TypeA || q.Qclass != dns.ClassINET {
		t.Errorf("question %+v", q)
	}
}

func TestProblems(t *testing.T) {
	ok := &Result{Capacity: []Step{{Rate: 2000, Seconds: 5, Received: 2000, Queries: 10000}}}
	if p := Problems(ok); len(p) != 0 {
		t.Errorf("clean run: %v", p)
	}
	lost := &Result{Capacity: []Step{{Rate: 2000, Seconds: 5, Received: 2000, Queries: 10000, Lost: 3}}}
	if p := Problems(lost); len(p) != 1 {
		t.Errorf("lost records: %v", p)
	}
	missed := &Result{Capacity: []Step{{Rate: 2000, Seconds: 5, Received: 2000, Queries: 9000}}}
	if p := Problems(missed); len(p) != 1 {
		t.Errorf("queries missed: %v", p)
	}
}

// TestResultSaysRecords: a Result's JSON names the tracer's ring buffer
// records as its text report does, "records", never "events".
func TestResultSaysRecords(t *testing.T) {
	r := &Result{
		Cases:    []CaseResult{{Name: "udp-forward", Records: 1, RecordBytes: 2, RecordsLost: 3, Runs: &Runs{RecordsLost: 4}}},
		Capacity: []Step{{Rate: 2000, Records: 5, RecordBytes: 6, RecordsPS: 7, Lost: 8}},
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases    []map[string]any `json:"cases"`
		Capacity []map[string]any `json:"capacity"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]float64{
		"case":     {"records": 1, "record_bytes": 2, "records_lost": 3},
		"runs":     {"records_lost": 4},
		"capacity": {"records": 5, "record_bytes": 6, "records_per_s": 7, "records_lost": 8},
	}
	got := map[string]map[string]any{"case": doc.Cases[0], "runs": doc.Cases[0]["runs"].(map[string]any), "capacity": doc.Capacity[0]}
	for part, keys := range want {
		for k, v := range keys {
			if got[part][k] != v {
				t.Errorf("%s: %q is %v, want %v", part, k, got[part][k], v)
			}
		}
		for k := range got[part] {
			if strings.Contains(k, "event") {
				t.Errorf("%s: key %q says events", part, k)
			}
		}
	}
}

func TestProcSelf(t *testing.T) {
	if _, err := procCPU(0); err != nil {
		t.Fatal(err)
	}
	rss, hwm, err := procMem(0)
	if err != nil || rss == 0 || hwm < rss {
		t.Fatalf("rss %d hwm %d: %v", rss, hwm, err)
	}
}

func TestMemorySmall(t *testing.T) {
	r := Memory(5000, 1000)
	if r.InFlight != 1000 || r.Evicted != 4000 {
		t.Errorf("in flight %d, evicted %d; want 1000, 4000", r.InFlight, r.Evicted)
	}
}

func TestProgDelta(t *testing.T) {
	before := progCounts{1: {Name: "tp_a", Runs: 10, RunTimeNs: 1000}, 2: {Name: "tp_b", Runs: 5, RunTimeNs: 500}}
	// tp_a ran 20 more times; a second tp_a (another variant) was loaded
	// meanwhile and ran 10 times; tp_b did not run.
	after := progCounts{1: {Name: "tp_a", Runs: 30, RunTimeNs: 5000}, 2: {Name: "tp_b", Runs: 5, RunTimeNs: 500},
		3: {Name: "tp_a", Runs: 10, RunTimeNs: 1000, Recursion: 2}}
	d := progDelta(before, after)
	if len(d) != 1 || d[0].Name != "tp_a" || d[0].Runs != 30 || d[0].RunTimeNs != 5000 || d[0].Recursion != 2 {
		t.Fatalf("delta %+v, want tp_a alone: 30 runs, 5000 ns, 2 recursion misses", d)
	}
	sum := addProgs(addProgs(nil, d), []ProgStat{{Name: "tp_a", Runs: 10, RunTimeNs: 1000}, {Name: "tp_c", Runs: 1, RunTimeNs: 9000}})
	if len(sum) != 2 || sum[0].Name != "tp_c" || sum[1].Runs != 40 || sum[1].NsPerRun != 150 {
		t.Fatalf("sum %+v, want tp_c first (most time), then tp_a with 40 runs at 150 ns", sum)
	}
	r := &Runs{Unit: "query", Units: 10, Programs: sum}
	r.sum()
	// 41 runs and 15,000 ns over 10 queries
	want := "4.10 runs, 1500 ns per query: tp_c 0.10 at 9000 ns, tp_a 4.00 at 150 ns"
	if got := runsLine(r); got != want {
		t.Errorf("runsLine:\n got %q\nwant %q", got, want)
	}
	if got := r.Per("tp_a"); got != 4 {
		t.Errorf("Per(tp_a) = %v, want 4", got)
	}
	if got := r.Per("tp_x"); got != 0 {
		t.Errorf("Per(tp_x) = %v, want 0", got)
	}
	if got := runsLine(&Runs{Unit: "loop", Invalid: true, RecordsLost: 7}); got != "invalid: 7 records lost during the pass" {
		t.Errorf("invalid pass: %q", got)
	}
}

// TestSkippedShown: the recursion misses in the tracer's summary reach the
// case and its text, without making the case invalid.
func TestSkippedShown(t *testing.T) {
	var sum TraceSummary
	line := `{"type":"summary","events":10,"events_lost":0,"recursion_misses":{"tp_kmem_cache_free":2,"tp_kfree_skb":1}}`
	if err := json.Unmarshal([]byte(line), &sum); err != nil {
		t.Fatal(err)
	}
	if sum.Skipped() != 3 {
		t.Fatalf("Skipped() = %d, want 3 from %s", sum.Skipped(), line)
	}
	var out bytes.Buffer
	WriteText(&out, &Result{Cases: []CaseResult{{Name: "syscall-open", Rounds: 1, Untraced: 100, Traced: 90, Ratio: 0.9, Skipped: sum.Skipped()}}})
	if !strings.Contains(out.String(), "syscall-open  the kernel skipped 3 hook calls") || strings.Contains(out.String(), "invalid") {
		t.Errorf("text:\n%s", out.String())
	}
}

// TestRoundOrder: with the floor every round runs each kind once, and over
// three rounds each kind goes first once (drift falls on all alike);
// without it the pair alternates.
func TestRoundOrder(t *testing.T) {
	first := map[roundKind]int{}
	for round := range 3 {
		kinds := roundOrder(round, true)
		seen := map[roundKind]bool{}
		for _, k := range kinds {
			seen[k] = true
		}
		if len(kinds) != 3 || len(seen) != 3 {
			t.Fatalf("round %d: %v, want untraced, hooks and traced once each", round, kinds)
		}
		first[kinds[0]]++
	}
	if len(first) != 3 {
		t.Errorf("first kinds over three rounds: %v, want each once", first)
	}
	if a, b := roundOrder(0, false), roundOrder(1, false); len(a) != 2 || a[0] != untraced || b[0] != traced {
		t.Errorf("without the floor: %v then %v", a, b)
	}
}

// TestHooksOnlyShown: the floor's rate and ratios reach the text.
func TestHooksOnlyShown(t *testing.T) {
	var out bytes.Buffer
	WriteText(&out, &Result{Cases: []CaseResult{{Name: "syscall-open", Rounds: 1, Untraced: 100, Traced: 90, Ratio: 0.9, HooksOnly: 95, HooksOnlyRatio: 0.95}}})
	if !strings.Contains(out.String(), "syscall-open  hooks only (every program emptied, same hooks): 95/s, 0.950 of untraced; traced is 0.947 of hooks only") {
		t.Errorf("text:\n%s", out.String())
	}
}

// TestUnfollowedAnswersInvalid: a DNS flood whose answers the tracer did not
// follow is shown invalid ("unmatched", with the count) and fails a smoke
// run; one that lost records says so instead.
func TestUnfollowedAnswersInvalid(t *testing.T) {
	r := &Result{Cases: []CaseResult{
		{Name: "dns-loopback", Rounds: 1, DNS: true, Untraced: 100, Traced: 90, Invalid: true, Unfollowed: 368952},
		{Name: "dns-forward", Rounds: 1, DNS: true, Untraced: 100, Traced: 90, Invalid: true, RecordsLost: 7},
	}}
	var out bytes.Buffer
	WriteText(&out, r)
	for _, want := range []string{
		"invalid   >=0.00 unmatched",
		"dns-loopback  368952 answers the flood read were not followed to their query by the tracer",
		"invalid   >=0.00 lost",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, out.String())
		}
	}
	p := Problems(r)
	if len(p) != 2 || !strings.Contains(p[0], "368952 answers the flood read were not followed") || !strings.Contains(p[1], "7 records lost") {
		t.Errorf("Problems = %q", p)
	}
}

// TestUnfollowedAnswersSplit: of the answers a flood read, those the
// kernel side followed to queries the correlator had already evicted do
// not make a round invalid (the records were read and looked up); those
// the kernel side did not follow do.
func TestUnfollowedAnswersSplit(t *testing.T) {
	sum := func(correlated, started, kernel uint64) *TraceSummary {
		s := &TraceSummary{}
		s.Queries.Answered = correlated
		s.KernelFlows.Started, s.KernelFlows.Answered = started, kernel
		return s
	}
	for _, tc := range []struct {
		name                 string
		read                 uint64
		sum                  *TraceSummary
		unfollowed, eviction uint64
	}{
		{"all followed", 1000, sum(1000, 1200, 1000), 0, 0},
		{"evicted in the correlator", 1000, sum(940, 1200, 1000), 0, 60},
		{"lost in the kernel", 1000, sum(900, 1200, 900), 100, 0},
		{"both", 1000, sum(850, 1200, 900), 100, 50},
		{"no kernel counts", 1000, sum(900, 0, 0), 100, 0},
	} {
		u, e := unfollowedAnswers(tc.read, tc.sum)
		if u != tc.unfollowed || e != tc.eviction {
			t.Errorf("%s: unfollowed %d, after eviction %d; want %d, %d", tc.name, u, e, tc.unfollowed, tc.eviction)
		}
	}
}

// TestRatioRangeShown: with two rounds or more the text gives the lowest
// and highest ratio of one round, so a reader knows how much of a
// difference between two runs is noise; one round gives none.
func TestRatioRangeShown(t *testing.T) {
	if got := roundRatios([]float64{100, 200, 100}, []float64{90, 120, 80}); len(got) != 2 || got[0] != 0.6 || got[1] != 0.9 {
		t.Errorf("roundRatios = %v, want [0.6 0.9]", got)
	}
	if got := roundRatios([]float64{100}, []float64{90}); got != nil {
		t.Errorf("one round: %v, want none", got)
	}
	var out bytes.Buffer
	WriteText(&out, &Result{Cases: []CaseResult{
		{Name: "dns-forward", Rounds: 3, Untraced: 100, Traced: 80, Ratio: 0.8, RatioRange: []float64{0.702, 0.864}},
		{Name: "udp-forward", Rounds: 1, Untraced: 100, Traced: 90, Ratio: 0.9},
	}})
	if !strings.Contains(out.String(), "dns-forward   round by round 0.702 to 0.864 (3 rounds): a difference within that is noise") ||
		strings.Contains(out.String(), "udp-forward   round by round") {
		t.Errorf("text:\n%s", out.String())
	}
}

// TestParseBusy: busy is user, nice, system, irq and softirq; idle,
// iowait and steal are not.
func TestParseBusy(t *testing.T) {
	stat := []byte("cpu  100 20 30 5000 40 6 7 800 0 0\ncpu0 50 10 15 2500 20 3 4 400 0 0\n")
	got, err := parseBusy(stat)
	if want := 163 * time.Second / clkTck; err != nil || got != want {
		t.Errorf("parseBusy = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7\n", "cpu 1 2 3\n", "cpu 1 x 3 4 5 6 7\n"} {
		if _, err := parseBusy([]byte(bad)); err == nil {
			t.Errorf("parseBusy(%q): no error", bad)
		}
	}
}

// TestMachineBusyCountsWork: this machine's busy time grows while this
// process spins.
func TestMachineBusyCountsWork(t *testing.T) {
	b0, err := machineBusy()
	if err != nil {
		t.Fatal(err)
	}
	c0, _ := procCPU(0)
	for c, _ := procCPU(0); c-c0 < 300*time.Millisecond; c, _ = procCPU(0) {
	}
	b1, err := machineBusy()
	if err != nil {
		t.Fatal(err)
	}
	if b1-b0 < 200*time.Millisecond {
		t.Errorf("300 ms of this process's CPU, machine busy grew %v", b1-b0)
	}
}

// TestCPUPerUnitShown: the text gives what tracing cost a unit and what
// the target leaves it; a case without the figures (invalid) gets no line.
func TestCPUPerUnitShown(t *testing.T) {
	var out bytes.Buffer
	WriteText(&out, &Result{Cases: []CaseResult{
		{Name: "dns-forward", Rounds: 1, DNS: true, Path: "forward", Target: 0.90, Untraced: 100, Traced: 70, Ratio: 0.7,
			UntracedCPUUs: 10.8, TracedCPUUs: 15.3},
		{Name: "udp-forward", Rounds: 1, Path: "forward", Target: 0.98, Untraced: 111111, Traced: 100000, Ratio: 0.9,
			UntracedCPUUs: 8, TracedCPUUs: 9, HooksOnlyCPUUs: 8.25, TracerCPU: 0.01,
			Runs: progRuns("packet", 1000, ProgStat{Name: "a", Runs: 4000, RunTimeNs: 300000}, ProgStat{Name: "b", Runs: 2000, RunTimeNs: 100000})},
		{Name: "dns-loopback", Rounds: 1, DNS: true, Target: 0.90, Invalid: true, RecordsLost: 3},
	}})
	want := "dns-forward   machine CPU per query: 10.80 µs untraced, 15.30 traced: tracing costs 4.50 µs a query, the target leaves 1.20"
	hooks := "udp-forward   machine CPU per packet: 8.00 µs untraced, 9.00 traced: tracing costs 1.00 µs a packet (the hooks alone 0.25), the target leaves 0.16"
	// 1.00 = hooks 0.25 + programs 400 µs / 1000 packets + reader 0.01 core / 100,000 a second + rest.
	split := "              of it: hooks 0.25, programs' own time 0.40 (6.00 runs, statistics' clock reads included), reader 0.10, rest +0.25"
	if !strings.Contains(out.String(), want) || !strings.Contains(out.String(), hooks) || !strings.Contains(out.String(), split) ||
		strings.Contains(out.String(), "dns-loopback  machine CPU") || strings.Count(out.String(), "of it:") != 1 {
		t.Errorf("text:\n%s\nwant lines %q, %q and %q, and no split without a count pass", out.String(), want, hooks, split)
	}
}

// progRuns is a count pass's Runs for units of unit and programs progs.
func progRuns(unit string, units float64, progs ...ProgStat) *Runs {
	r := &Runs{Unit: unit, Units: units, Programs: progs}
	r.sum()
	return r
}

// TestRunsReported: the count pass gives each case's runs and program time
// per unit, and each program's runs, time and time per run, in the JSON
// and in the text, whose times say they are not measurements under
// emulation; alone (--count-only), with no rates measured, it shows none.
func TestRunsReported(t *testing.T) {
	r := &Result{Tier: "fentry", Cases: []CaseResult{{Name: "dns-forward", DNS: true,
		Runs: progRuns("query", 100, ProgStat{Name: "fexit_udp_sendmsg", Runs: 200, RunTimeNs: 60000, NsPerRun: 300},
			ProgStat{Name: "fentry_skb_consume_udp", Runs: 200, RunTimeNs: 20000, NsPerRun: 100})}}}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases []struct {
			Runs map[string]any `json:"runs"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	runs := doc.Cases[0].Runs
	if runs["runs_per_unit"] != 4.0 || runs["prog_ns_per_unit"] != 800.0 {
		t.Errorf("runs %v, want runs_per_unit 4 and prog_ns_per_unit 800", runs)
	}
	p := runs["programs"].([]any)[0].(map[string]any)
	if p["name"] != "fexit_udp_sendmsg" || p["runs"] != 200.0 || p["run_time_ns"] != 60000.0 || p["ns_per_run"] != 300.0 {
		t.Errorf("program %v", p)
	}
	var out bytes.Buffer
	WriteText(&out, r)
	if strings.Contains(out.String(), "untraced/s") {
		t.Errorf("a count pass alone (no rounds) shows a table of rates:\n%s", out.String())
	}
	for _, want := range []string{
		"dns-forward   4.00 runs, 800 ns per query: fexit_udp_sendmsg 2.00 at 300 ns, fentry_skb_consume_udp 2.00 at 100 ns",
		"under emulation, qemu TCG, they time the emulator",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text:\n%s\nwant %q", out.String(), want)
		}
	}
}
