package runcost

import (
	"errors"
	"strings"
	"testing"

	"github.com/dnsrace/dnsrace/internal/testutil"
)

// TestEveryRunCounted: under both triggers each counting program ran
// exactly once per firing, and the kernel's run_cnt (empty-stats) agrees:
// the figures are per run because the runs happened.
func TestEveryRunCounted(t *testing.T) {
	testutil.RequireRoot(t)
	const n = 20000
	res, err := Measure(Config{Iterations: n, Rounds: 2})
	if err != nil {
		t.Fatal(err)
	}
	if want := len(Triggers) * len(Variants); len(res) != want {
		t.Fatalf("%d results, want %d", len(res), want)
	}
	for _, r := range res {
		v := Variants[indexOf(r.Variant)]
		switch {
		case v.counts():
			// The syscall trigger's tracepoint may also fire for another
			// process renaming a thread meanwhile: a few more, never fewer.
			if r.Counted < 2*n || r.Counted > 2*n+100 {
				t.Errorf("%s/%s counted %d runs, want %d", r.Trigger, r.Variant, r.Counted, 2*n)
			}
		case v.Stats:
			if r.KernelRuns < 2*n || r.KernelRuns > 2*n+100 || r.KernelNsPerRun <= 0 {
				t.Errorf("%s/%s: kernel run_cnt %d (%.1f ns a run), want %d runs", r.Trigger, r.Variant, r.KernelRuns, r.KernelNsPerRun, 2*n)
			}
		}
		if len(r.Rounds) != 2 || r.NsPerFire <= 0 {
			t.Errorf("%s/%s: rounds %v", r.Trigger, r.Variant, r.Rounds)
		}
	}
	c, err := MeasureCall(100000, 3)
	if err != nil || c.DirectNs <= 0 || c.IndirectNs <= 0 {
		t.Errorf("MeasureCall = %+v, %v", c, err)
	}
	var b strings.Builder
	WriteText(&b, ReadMachine(), c, res)
	t.Log("\n" + b.String())
}

func indexOf(name string) int {
	for i, v := range Variants {
		if v.Name == name {
			return i
		}
	}
	return -1
}

// TestMissedRunsFail: a program at a tracepoint the trigger does not fire
// counts nothing, and Measure says so instead of reporting a cost.
func TestMissedRunsFail(t *testing.T) {
	testutil.RequireRoot(t)
	m, err := newMaps()
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var r Result
	err = measureOnce("task_newtask", prctlLoop, Variants[indexOf("count")], m, 1000, &r)
	if !errors.Is(err, ErrMissedRuns) {
		t.Fatalf("a program that never ran: err = %v, want ErrMissedRuns", err)
	}
}

func TestUnknownNames(t *testing.T) {
	if _, err := Measure(Config{Variants: []string{"nope"}}); err == nil {
		t.Error("unknown variant accepted")
	}
	if _, err := Measure(Config{Triggers: []string{"nope"}}); err == nil {
		t.Error("unknown trigger accepted")
	}
}

// BenchmarkRun is one firing per op, per trigger and variant: ns/op less
// that of none is one run's cost (go test -bench Run -run '^$').
func BenchmarkRun(b *testing.B) {
	testutil.RequireRoot(b)
	m, err := newMaps()
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	for _, t := range Triggers {
		fire := t.fire
		if t.setup != nil {
			f, undo, err := t.setup()
			if err != nil {
				b.Fatal(err)
			}
			defer undo()
			fire = f
		}
		for _, v := range Variants {
			b.Run(t.Name+"/"+v.Name, func(b *testing.B) {
				a, err := attach(v, t.Tracepoint, m)
				if err != nil {
					b.Fatal(err)
				}
				defer a.Close()
				b.ResetTimer()
				d, err := fire(uint64(b.N))
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(d.Nanoseconds())/float64(b.N), "ns/fire")
			})
		}
	}
}
