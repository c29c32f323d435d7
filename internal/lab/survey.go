package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// SurveyResult is the output of `dnsrace lab survey --json`: per scenario,
// the rates a kernel shows, comparable across kernels and machines.
type SurveyResult struct {
	Version   int              `json:"version"`
	Kernel    string           `json:"kernel"`
	CPUs      int              `json:"cpus"`
	Started   time.Time        `json:"started"`
	Scenarios []ScenarioResult `json:"scenarios"`
}

// ScenarioResult aggregates the runs of one scenario.
type ScenarioResult struct {
	Name         string  `json:"name"`
	Resolver     string  `json:"resolver,omitempty"`
	Runs         int     `json:"runs"`
	Met          int     `json:"expectation_met"`
	QueriesSent  uint64  `json:"queries_sent"`
	LostReplies  uint64  `json:"lost_replies"`
	Lookups      int     `json:"lookups"`
	Stalls       int     `json:"stalls"`
	InsertFailed uint64  `json:"insert_failed"`
	ClashResolve uint64  `json:"clash_resolve"`
	Drop         uint64  `json:"drop"`
	RaceRate     float64 `json:"race_rate"`
	DropRate     float64 `json:"drop_rate"`
	ResolveRate  float64 `json:"resolve_rate"`
	LossRate     float64 `json:"loss_rate"`
	StallRate    float64 `json:"stall_rate"`
	Latency      Latency `json:"latency"`
}

// surveyVersion changes when a field changes meaning or is added.
// 1: the rates and latency percentiles; 2: adds each scenario's resolver
// and its latency histogram. ReadSurvey reads both.
const surveyVersion = 2

// LatencyHistogram counts lookups by latency in log-spaced buckets, 100 per
// decade (each 2.3% wide), only the non-empty ones: enough to draw a CDF in
// which 2.5 s and 5 s stalls stand apart, at a few hundred numbers per
// scenario. Bucket i holds the lookups that took more than LeMs[i-1] and at
// most LeMs[i] milliseconds.
type LatencyHistogram struct {
	LeMs  []float64 `json:"le_ms"`
	Count []int     `json:"count"`
}

// histBucketsPerDecade sets the histogram's resolution; histMinMs is the
// first bucket's upper bound (shorter lookups count there).
const (
	histBucketsPerDecade = 100
	histMinMs            = 0.01
)

// histBound is bucket k's upper bound in ms: 10^(k/100) rounded up to 4
// significant digits (short in JSON, and still an upper bound).
func histBound(k int) float64 {
	v := math.Pow(10, float64(k)/histBucketsPerDecade)
	scale := math.Pow(10, 3-math.Floor(math.Log10(v)))
	return math.Ceil(v*scale-1e-9) / scale
}

// histogram builds the latency histogram of sorted durations.
func histogram(sorted []time.Duration) *LatencyHistogram {
	h := &LatencyHistogram{LeMs: []float64{}, Count: []int{}}
	minK := int(math.Round(math.Log10(histMinMs) * histBucketsPerDecade))
	for _, d := range sorted {
		ms := float64(d) / float64(time.Millisecond)
		k := minK
		if ms > histBound(minK) {
			// Log10 is a first guess; the bounds decide.
			k = int(math.Ceil(math.Log10(ms) * histBucketsPerDecade))
			for ms > histBound(k) {
				k++
			}
			for k > minK && ms <= histBound(k-1) {
				k--
			}
		}
		le := histBound(k)
		if n := len(h.LeMs); n > 0 && h.LeMs[n-1] == le {
			h.Count[n-1]++
			continue
		}
		h.LeMs = append(h.LeMs, le)
		h.Count = append(h.Count, 1)
	}
	return h
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Aggregate folds the reports of one scenario's runs into a result.
func Aggregate(name string, reps []*Report) ScenarioResult {
	r := ScenarioResult{Name: name, Runs: len(reps)}
	var all []time.Duration
	for _, rep := range reps {
		r.Resolver = rep.Resolver
		if rep.Expectation.Met {
			r.Met++
		}
		r.QueriesSent += rep.QueriesSent
		r.LostReplies += rep.LostReplies
		r.Lookups += rep.Lookups
		r.Stalls += rep.Stalls
		r.InsertFailed += rep.Conntrack.InsertFailed
		r.ClashResolve += rep.Conntrack.ClashResolve
		r.Drop += rep.Conntrack.Drop
		for _, c := range rep.Clients {
			all = append(all, c.durations...)
		}
	}
	q := float64(r.QueriesSent)
	r.RaceRate = ratio(float64(r.InsertFailed+r.ClashResolve), q)
	r.DropRate = ratio(float64(r.Drop), q)
	r.ResolveRate = ratio(float64(r.ClashResolve), float64(r.ClashResolve+r.InsertFailed))
	r.LossRate = ratio(float64(r.LostReplies), q)
	r.StallRate = ratio(float64(r.Stalls), float64(r.Lookups))
	slices.Sort(all)
	r.Latency = percentiles(all)
	r.Latency.Histogram = histogram(all)
	return r
}

func percentiles(sorted []time.Duration) Latency {
	pct := func(p float64) float64 {
		if len(sorted) == 0 {
			return 0
		}
		return float64(sorted[int(p*float64(len(sorted)-1))].Microseconds()) / 1000
	}
	return Latency{P50Ms: pct(0.50), P99Ms: pct(0.99), MaxMs: pct(1)}
}

// SurveyConfig drives Survey.
type SurveyConfig struct {
	Prefix     string
	Scenarios  []Scenario
	Iterations int
	Duration   time.Duration // 0: each scenario's default
	// Resolver replaces glibc in the scenarios that use it ("": glibc);
	// under emulation a glibc lookup is too slow for the races to happen.
	Resolver string
	Progress io.Writer // one line per run; nil for none
}

// Survey runs every scenario Iterations times, each in a fresh lab.
func Survey(ctx context.Context, cfg SurveyConfig) (*SurveyResult, error) {
	res := &SurveyResult{Version: surveyVersion, Kernel: kernelRelease(), CPUs: runtime.NumCPU(), Started: time.Now()}
	for _, sc := range cfg.Scenarios {
		var reps []*Report
		for i := 0; i < cfg.Iterations; i++ {
			drive := DriveConfig{Scenario: sc, Duration: cfg.Duration}
			if cfg.Resolver != "" && sc.Resolver == ResolverGlibc {
				drive.Resolver = cfg.Resolver
			}
			rep, err := Run(ctx, RunConfig{Prefix: cfg.Prefix, Drive: drive})
			if err != nil {
				return nil, fmt.Errorf("%s run %d: %w", sc.Name, i+1, err)
			}
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "%s run %d/%d: %d lookups, %d stalls, insert_failed %d, clash_resolve %d, expectation met: %v\n",
					sc.Name, i+1, cfg.Iterations, rep.Lookups, rep.Stalls, rep.Conntrack.InsertFailed, rep.Conntrack.ClashResolve, rep.Expectation.Met)
			}
			reps = append(reps, rep)
		}
		res.Scenarios = append(res.Scenarios, Aggregate(sc.Name, reps))
	}
	return res, nil
}

// ReadSurvey reads a `lab survey --json` file.
func ReadSurvey(path string) (*SurveyResult, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r SurveyResult
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if r.Version < 1 || r.Version > surveyVersion {
		return nil, fmt.Errorf("reading %s: survey format version %d, this dnsrace reads 1 to %d", path, r.Version, surveyVersion)
	}
	return &r, nil
}

// Compare writes a side-by-side table of survey results, one row per
// scenario and metric, one column per result, and the change from the first
// to the last.
func Compare(w io.Writer, results ...*SurveyResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "scenario\tmetric")
	for _, r := range results {
		fmt.Fprintf(tw, "\t%s", r.Kernel)
	}
	fmt.Fprintf(tw, "\tchange\n")
	for _, n := range ScenarioNamesOf(results...) {
		var rows []ScenarioResult
		for _, r := range results {
			if s, ok := r.Scenario(n); ok {
				rows = append(rows, s)
			}
		}
		if len(rows) != len(results) {
			fmt.Fprintf(tw, "%s\t(not in every file)%s\n", n, strings.Repeat("\t", len(results)+1))
			continue
		}
		for _, m := range []struct {
			metric string
			get    func(ScenarioResult) float64
		}{
			{"race_rate", func(s ScenarioResult) float64 { return s.RaceRate }},
			{"drop_rate", func(s ScenarioResult) float64 { return s.DropRate }},
			{"resolve_rate", func(s ScenarioResult) float64 { return s.ResolveRate }},
			{"loss_rate", func(s ScenarioResult) float64 { return s.LossRate }},
			{"stall_rate", func(s ScenarioResult) float64 { return s.StallRate }},
			{"p50_ms", func(s ScenarioResult) float64 { return s.Latency.P50Ms }},
			{"p99_ms", func(s ScenarioResult) float64 { return s.Latency.P99Ms }},
			{"max_ms", func(s ScenarioResult) float64 { return s.Latency.MaxMs }},
		} {
			fmt.Fprintf(tw, "%s\t%s", n, m.metric)
			for _, s := range rows {
				fmt.Fprintf(tw, "\t%.4g", m.get(s))
			}
			fmt.Fprintf(tw, "\t%s\n", change(m.get(rows[0]), m.get(rows[len(rows)-1])))
		}
	}
	tw.Flush()
}

// Scenario returns the result of the named scenario.
func (r *SurveyResult) Scenario(name string) (ScenarioResult, bool) {
	for _, s := range r.Scenarios {
		if s.Name == name {
			return s, true
		}
	}
	return ScenarioResult{}, false
}

// ScenarioNamesOf lists the scenarios of the results, in the order they
// first appear.
func ScenarioNamesOf(results ...*SurveyResult) []string {
	var names []string
	for _, r := range results {
		for _, s := range r.Scenarios {
			if !slices.Contains(names, s.Name) {
				names = append(names, s.Name)
			}
		}
	}
	return names
}

func change(a, b float64) string {
	switch {
	case a == b:
		return "="
	case a == 0:
		return "new"
	}
	return fmt.Sprintf("%+.0f%%", (b-a)/a*100)
}
