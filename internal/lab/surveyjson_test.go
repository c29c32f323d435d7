package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/dnsrace/dnsrace/internal/testutil"
)

// SurveyJSONMarker starts the line TestSurveyJSON prints its result on.
const SurveyJSONMarker = "DNSRACE-SURVEY-JSON "

// TestSurveyJSON is `dnsrace lab survey --json` for a machine that can run
// only test binaries: the VM harness's guest (cmd/vmtest), which saves its console
// (docs/vmtest.md). It runs every scenario three times with the resolver
// DNSRACE_TEST_RESOLVER names in place of glibc (the guest sets it: under
// emulation glibc is too slow to race) and prints the result as one line
// after SurveyJSONMarker. Without DNSRACE_TEST_RESOLVER it skips. How the
// README's kernel picture was made with it: docs/survey.md.
func TestSurveyJSON(t *testing.T) {
	resolver := os.Getenv("DNSRACE_TEST_RESOLVER")
	if resolver == "" {
		t.Skip("a tool, not a check: runs when DNSRACE_TEST_RESOLVER is set (the VM harness's guest (cmd/vmtest) sets it)")
	}
	testutil.RequireRoot(t)
	res, err := Survey(context.Background(), SurveyConfig{
		Prefix: "dnsrace-bj", Scenarios: Scenarios, Iterations: 3, Resolver: resolver, Progress: os.Stdout,
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("\n%s%s\n", SurveyJSONMarker, b)
}
