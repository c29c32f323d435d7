package overhead

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/testutil"
)

// TestCostCases runs `dnsrace bench`'s cost cases in the tier this test
// binary was given (DNSRACE_TEST_TIER), so cmd/vmtest can measure the
// fentry and kprobe tiers inside a guest, where the host cannot attach
// them. It runs only when asked, with the dnsrace binary in DNSRACE_BIN
// (the guest's /usr/bin/dnsrace):
//
//	DNSRACE_TEST_BENCH_CASES  cases, comma separated (dnsrace bench --case)
//	DNSRACE_TEST_BENCH_ROUNDS rounds per case (default 2)
//	DNSRACE_TEST_BENCH_SECONDS each flood's length (default 5)
//	DNSRACE_TEST_BENCH_FLOOR  1: add the hooks-only rounds (bench --floor)
//
// It fails where `bench --smoke` would: lost records, answers not
// followed, a case without a result.
func TestCostCases(t *testing.T) {
	cases := os.Getenv("DNSRACE_TEST_BENCH_CASES")
	if cases == "" {
		t.Skip("DNSRACE_TEST_BENCH_CASES not set: a measurement, run on request (docs/vmtest.md)")
	}
	testutil.RequireRoot(t)
	exe := os.Getenv("DNSRACE_BIN")
	if exe == "" {
		t.Fatal("DNSRACE_BIN not set: the dnsrace binary whose tracer is measured")
	}
	tier := os.Getenv("DNSRACE_TEST_TIER") // empty: Config's default, tracepoint
	if tier == "fentry" {
		// The trace suites assert the loader's fallback on such kernels;
		// here there is no fentry tier to measure.
		if limit := testutil.FentryLimit(); limit != "" {
			t.Skipf("no fentry tier on this kernel: %s", limit)
		}
	}
	cfg := Config{
		Exe:          exe,
		Cases:        strings.Split(cases, ","),
		Rounds:       testutil.EnvInt(t, "DNSRACE_TEST_BENCH_ROUNDS", 2, 1),
		Duration:     time.Duration(testutil.EnvInt(t, "DNSRACE_TEST_BENCH_SECONDS", 5, 1)) * time.Second,
		SkipCapacity: true,
		Attach:       tier,
		Floor:        os.Getenv("DNSRACE_TEST_BENCH_FLOOR") == "1",
		Log:          os.Stderr,
	}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	WriteText(&out, res)
	t.Logf("tier %s, kernel %s:\n%s", res.Tier, res.Kernel, out.String())
	if len(res.Cases) != len(cfg.Cases) {
		t.Errorf("%d cases measured, %d asked", len(res.Cases), len(cfg.Cases))
	}
	for _, p := range Problems(res) {
		t.Error(p)
	}
}
