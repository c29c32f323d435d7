package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"text/tabwriter"
	"time"
)

// BenchResult is the output of `dnsrace lab bench --json`: per scenario,
// the rates a kernel shows, comparable across kernels and machines.
type BenchResult struct {
	Version   int              `json:"version"`
	Kernel    string           `json:"kernel"`
	CPUs      int              `json:"cpus"`
	Started   time.Time        `json:"started"`
	Scenarios []ScenarioResult `json:"scenarios"`
}

// ScenarioResult aggregates the runs of one scenario.
type ScenarioResult struct {
	Name         string  `json:"name"`
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

// benchVersion changes when a field changes meaning.
const benchVersion = 1

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

// BenchConfig drives Bench.
type BenchConfig struct {
	Prefix     string
	Scenarios  []Scenario
	Iterations int
	Duration   time.Duration // 0: each scenario's default
	Progress   io.Writer     // one line per run; nil for none
}

// Bench runs every scenario Iterations times, each in a fresh lab.
func Bench(ctx context.Context, cfg BenchConfig) (*BenchResult, error) {
	res := &BenchResult{Version: benchVersion, Kernel: kernelRelease(), CPUs: runtime.NumCPU(), Started: time.Now()}
	for _, sc := range cfg.Scenarios {
		var reps []*Report
		for i := 0; i < cfg.Iterations; i++ {
			rep, err := Run(ctx, RunConfig{Prefix: cfg.Prefix, Drive: DriveConfig{Scenario: sc, Duration: cfg.Duration}})
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

// ReadBench reads a `lab bench --json` file.
func ReadBench(path string) (*BenchResult, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r BenchResult
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if r.Version != benchVersion {
		return nil, fmt.Errorf("reading %s: bench format version %d, this dnsrace reads %d", path, r.Version, benchVersion)
	}
	return &r, nil
}

// Compare writes a side-by-side table of two bench results, one row per
// scenario and metric, with the change from a to b.
func Compare(w io.Writer, a, b *BenchResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "scenario\tmetric\t%s\t%s\tchange\n", a.Kernel, b.Kernel)
	byName := map[string]ScenarioResult{}
	for _, s := range b.Scenarios {
		byName[s.Name] = s
	}
	names := []string{}
	for _, s := range a.Scenarios {
		names = append(names, s.Name)
	}
	for _, s := range b.Scenarios {
		if !slices.Contains(names, s.Name) {
			names = append(names, s.Name)
		}
	}
	aBy := map[string]ScenarioResult{}
	for _, s := range a.Scenarios {
		aBy[s.Name] = s
	}
	for _, n := range names {
		x, okA := aBy[n]
		y, okB := byName[n]
		if !okA || !okB {
			fmt.Fprintf(tw, "%s\t(only in one file)\t\t\t\n", n)
			continue
		}
		rows := []struct {
			metric string
			a, b   float64
		}{
			{"race_rate", x.RaceRate, y.RaceRate},
			{"drop_rate", x.DropRate, y.DropRate},
			{"resolve_rate", x.ResolveRate, y.ResolveRate},
			{"loss_rate", x.LossRate, y.LossRate},
			{"stall_rate", x.StallRate, y.StallRate},
			{"p50_ms", x.Latency.P50Ms, y.Latency.P50Ms},
			{"p99_ms", x.Latency.P99Ms, y.Latency.P99Ms},
			{"max_ms", x.Latency.MaxMs, y.Latency.MaxMs},
		}
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%.4g\t%.4g\t%s\n", n, r.metric, r.a, r.b, change(r.a, r.b))
		}
	}
	tw.Flush()
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
