package lab

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/ctstats"
)

func TestPortRange(t *testing.T) {
	var r PortRange
	if err := r.Set("10000-10015"); err != nil || r.Min != 10000 || r.Max != 10015 {
		t.Fatalf("got %v, %v", r, err)
	}
	if err := r.Set("53"); err != nil || r.Min != 53 || r.Max != 53 {
		t.Fatalf("single port: %v, %v", r, err)
	}
	for _, bad := range []string{"2000-1000", "0-10", "a-b", "70000", ""} {
		if err := r.Set(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestValidate(t *testing.T) {
	ok := Topology{Prefix: "x", Pods: 1, Backends: 2}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []Topology{
		{Prefix: "x", Pods: 0, Backends: 2},
		{Prefix: "x", Pods: 1, Backends: 0},
		{Prefix: "x", Pods: MaxPods + 1, Backends: 1},
		{Prefix: "a/b", Pods: 1, Backends: 1},
		{Prefix: "x", Pods: 1, Backends: 1, SNAT: true, SNATPorts: PortRange{20, 10}},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestParseSNMPUdp(t *testing.T) {
	raw := []byte(`Ip: Forwarding DefaultTTL
Ip: 1 64
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 10 7 3 12 2 0 0 0 0
UdpLite: InDatagrams NoPorts
UdpLite: 0 0
`)
	u, err := parseSNMPUdp(raw)
	if err != nil {
		t.Fatal(err)
	}
	if u != (UDPCounters{NoPorts: 7, InErrors: 3, RcvbufErrors: 2}) {
		t.Fatalf("got %+v", u)
	}
	if _, err := parseSNMPUdp([]byte("Ip: a\nIp: 1\n")); err == nil {
		t.Fatal("no Udp lines accepted")
	}
}

func TestScenarioLookup(t *testing.T) {
	for _, n := range ScenarioNames() {
		sc, err := LookupScenario(n)
		if err != nil || sc.Check == nil || sc.Expect == "" || sc.Duration == 0 {
			t.Errorf("%s: %+v %v", n, sc, err)
		}
		if err := sc.Topology("dnsrace", sc.Pods).Validate(); err != nil {
			t.Errorf("%s: default topology invalid: %v", n, err)
		}
	}
	if _, err := LookupScenario("nope"); err == nil || !strings.Contains(err.Error(), "snat-port") {
		t.Errorf("unknown scenario error should list the known ones: %v", err)
	}
}

func TestAggregateAndCompare(t *testing.T) {
	mk := func(sent, lost uint64, insertFailed, clash uint64, durations ...time.Duration) *Report {
		r := &Report{QueriesSent: sent, LostReplies: lost, Conntrack: ctstats.Counters{InsertFailed: insertFailed, ClashResolve: clash}}
		c := &ClientReport{unit: 5 * time.Second}
		for _, d := range durations {
			c.record(d, true)
		}
		r.Clients = []*ClientReport{c}
		r.summarize()
		r.Expectation.Met = true
		return r
	}
	a := Aggregate("snat-port", []*Report{
		mk(100, 10, 10, 0, 5*time.Millisecond, 5010*time.Millisecond),
		mk(100, 0, 0, 30, 7*time.Millisecond),
	})
	if a.Runs != 2 || a.Met != 2 || a.QueriesSent != 200 || a.Stalls != 1 || a.Lookups != 3 {
		t.Fatalf("aggregate %+v", a)
	}
	if a.RaceRate != 40.0/200 || a.ResolveRate != 30.0/40 || a.LossRate != 10.0/200 {
		t.Fatalf("rates %+v", a)
	}
	if a.Latency.MaxMs != 5010 || a.Latency.P50Ms != 7 {
		t.Fatalf("latency %+v", a.Latency)
	}
	b := a
	b.RaceRate = a.RaceRate * 2
	var out bytes.Buffer
	Compare(&out, &SurveyResult{Kernel: "6.1", Scenarios: []ScenarioResult{a}}, &SurveyResult{Kernel: "6.18", Scenarios: []ScenarioResult{b}})
	if !strings.Contains(out.String(), "race_rate") || !strings.Contains(out.String(), "+100%") {
		t.Fatalf("compare output:\n%s", out.String())
	}
}

// TestLatencyHistogram: every lookup lands in the bucket whose bounds hold
// it, 2.5 s and 5 s stalls in different buckets, none lost.
func TestLatencyHistogram(t *testing.T) {
	ds := []time.Duration{time.Microsecond, 10 * time.Microsecond, 350 * time.Microsecond, 351 * time.Microsecond,
		time.Millisecond, 2503 * time.Millisecond, 2512 * time.Millisecond, 5002 * time.Millisecond, 5002 * time.Millisecond, 5012 * time.Millisecond, 10011 * time.Millisecond}
	h := histogram(ds)
	if len(h.LeMs) != len(h.Count) {
		t.Fatalf("%d bounds, %d counts", len(h.LeMs), len(h.Count))
	}
	total := 0
	for i, le := range h.LeMs {
		total += h.Count[i]
		if i > 0 && le <= h.LeMs[i-1] {
			t.Errorf("bounds not increasing: %v", h.LeMs)
		}
		if i > 0 && le/h.LeMs[i-1] < 1.02 {
			t.Errorf("buckets %v and %v closer than one bucket width", h.LeMs[i-1], le)
		}
	}
	if total != len(ds) {
		t.Errorf("%d lookups counted, want %d", total, len(ds))
	}
	// Each duration is in the first bucket whose bound is >= it.
	for _, d := range ds {
		ms := float64(d) / 1e6
		i := 0
		for i < len(h.LeMs) && h.LeMs[i] < ms {
			i++
		}
		if i == len(h.LeMs) {
			t.Fatalf("%v above every bound %v", d, h.LeMs)
		}
		if i > 0 && ms <= h.LeMs[i-1] {
			t.Errorf("%v: at most the previous bound %v", d, h.LeMs[i-1])
		}
		if h.LeMs[i] > ms*1.024 && ms > histMinMs {
			t.Errorf("%v in bucket %v: wider than 2.4%%", d, h.LeMs[i])
		}
	}
	if want := []int{2, 2, 1, 2, 3, 1}; !slices.Equal(h.Count, want) {
		t.Errorf("counts %v (bounds %v), want %v", h.Count, h.LeMs, want)
	}
}

// TestReadSurveyVersions: format 1 files still read; unknown versions do not.
func TestReadSurveyVersions(t *testing.T) {
	dir := t.TempDir()
	for v, ok := range map[int]bool{0: false, 1: true, 2: true, 3: false} {
		p := filepath.Join(dir, fmt.Sprintf("v%d.json", v))
		if err := os.WriteFile(p, fmt.Appendf(nil, `{"version":%d,"kernel":"6.1","scenarios":[{"name":"snat-port","latency":{"p50_ms":1}}]}`, v), 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := ReadSurvey(p)
		if (err == nil) != ok {
			t.Errorf("version %d: %v", v, err)
		}
		if ok && (r.Kernel != "6.1" || r.Scenarios[0].Latency.Histogram != nil) {
			t.Errorf("version %d: %+v", v, r)
		}
	}
}

func TestStallCounting(t *testing.T) {
	c := &ClientReport{unit: 5 * time.Second}
	c.record(20*time.Millisecond, true)
	c.record(5004*time.Millisecond, true)
	c.record(10011*time.Millisecond, false)
	if c.Stalls != 2 || c.StallTimeouts != 3 || c.OK != 2 || c.Failed != 1 {
		t.Fatalf("%+v", c)
	}
}

func TestOwnedBy(t *testing.T) {
	for name, want := range map[string]bool{
		"dnsrace-node": true, "dnsrace-dns": true, "dnsrace-pod0": true, "dnsrace-pod12": true,
		"dnsrace-tl-node": false, "dnsrace-tl-pod0": false, "dnsrace-pod": false, "dnsrace-pod01": false,
		"dnsrace-podx": false, "dnsrace-nodes": false, "other-node": false,
	} {
		if got := ownedBy("dnsrace", name); got != want {
			t.Errorf("ownedBy(dnsrace, %s) = %v, want %v", name, got, want)
		}
	}
}

func TestNATNamespaces(t *testing.T) {
	node := Topology{Prefix: "p", Pods: 3, Backends: 2}
	if got := node.NATNamespaces(); len(got) != 1 || got[0] != "p-node" {
		t.Errorf("node NAT: %v", got)
	}
	if node.Port() != 53 {
		t.Errorf("default backend port %d", node.Port())
	}
	local := Topology{Prefix: "p", Pods: 3, Backends: 2, LocalNAT: true, BackendPort: 5353}
	if got := local.NATNamespaces(); len(got) != 3 || got[0] != "p-pod0" || got[2] != "p-pod2" {
		t.Errorf("local NAT: %v", got)
	}
	if local.Port() != 5353 {
		t.Errorf("backend port %d", local.Port())
	}
	for _, n := range []string{"target-port", "local-out", "local-out-snat"} {
		sc, err := LookupScenario(n)
		if err != nil {
			t.Fatal(err)
		}
		tp := sc.Topology("p", sc.Pods)
		if (n != "target-port") != tp.LocalNAT || (n == "target-port") != (tp.Port() == 5353) {
			t.Errorf("%s: topology %+v", n, tp)
		}
	}
}

func TestWriteTextLocalNAT(t *testing.T) {
	r := &Report{
		Scenario: "local-out-snat", Topology: Topology{Prefix: "dnsrace", Pods: 2, LocalNAT: true},
		NATNetNS:  []uint32{11, 12},
		Conntrack: ctstats.Counters{InsertFailed: 5, Drop: 5},
		ConntrackByNetNS: []NetNSConntrack{
			{NetNS: 11, Name: "dnsrace-pod0", Conntrack: ctstats.Counters{InsertFailed: 2, Drop: 2}},
			{NetNS: 12, Name: "dnsrace-pod1", Conntrack: ctstats.Counters{InsertFailed: 3, Drop: 3}},
		},
	}
	var b bytes.Buffer
	r.WriteText(&b)
	for _, want := range []string{"insert_failed +5", "summed over the 2 pods' own netns", "pod1         insert_failed +3, drop +3, clash_resolve +0 (netns 12)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in\n%s", want, b.String())
		}
	}
}
