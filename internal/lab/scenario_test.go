package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/dnsrace/dnsrace/internal/testutil"
)

// testPrefix is unique per test process: two runs on one machine never
// meet (a lab's prefix is its lock).
var testPrefix = fmt.Sprintf("dnsrace-tl%d", os.Getpid())

// assertNothingLeft fails t if the lab left anything behind (Leftovers).
func assertNothingLeft(t *testing.T, prefix string) {
	t.Helper()
	if left := Leftovers(prefix); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestScenarios runs every scenario on this machine's kernel and checks the
// outcome each must show. Set DNSRACE_SCENARIOS to run a subset. make test
// skips it (make test-lab runs it): every scenario runs there inside its
// TestTrace* (internal/trace), held to the same expectation with the tracer
// attached, and twice would be four minutes of its budget.
func TestScenarios(t *testing.T) {
	testutil.RequireRoot(t)
	only := os.Getenv("DNSRACE_SCENARIOS")
	if only != "" {
		// A misspelt name would run nothing and pass.
		if _, err := LookupScenarios(strings.Split(only, ",")); err != nil {
			t.Fatalf("DNSRACE_SCENARIOS=%q: %v", only, err)
		}
	}
	for _, sc := range Scenarios {
		if only != "" && !strings.Contains(","+only+",", ","+sc.Name+",") {
			continue
		}
		t.Run(sc.Name, func(t *testing.T) {
			rep, err := Run(context.Background(), RunConfig{Prefix: testPrefix, Drive: DriveConfig{Scenario: sc}})
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.MarshalIndent(rep, "", " ")
			if !rep.Expectation.Met {
				t.Errorf("%s: expectation %q not met: %v\n%s", sc.Name, sc.Expect, rep.Expectation.Failures, b)
			} else {
				t.Logf("lookups %d stalls %d sent %d answers %d conntrack %+v nodeUDP %+v podUDP %+v servers %+v pairs %d/%d",
					rep.Lookups, rep.Stalls, rep.QueriesSent, rep.AnswersReceived, rep.Conntrack, rep.NodeUDP, rep.PodUDP, rep.Servers, rep.PairsLost, rep.Pairs)
			}
			if rep.Lookups == 0 {
				t.Errorf("no lookup completed")
			}
			assertNothingLeft(t, testPrefix)
		})
	}
}

// TestSNATPortWithDnsmasq: the race does not depend on the lab's own DNS
// server; real dnsmasq backends show it the same way.
func TestSNATPortWithDnsmasq(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("dnsmasq"); err != nil {
		testutil.SkipOrFail(t, "dnsmasq not installed (scripts/install-deps installs dnsmasq-base)")
	}
	sc, _ := LookupScenario("snat-port")
	sc.Server.Kind = ServerDnsmasq
	rep, err := Run(context.Background(), RunConfig{Prefix: testPrefix, Drive: DriveConfig{Scenario: sc}})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Expectation.Met {
		t.Errorf("snat-port with dnsmasq: %v", rep.Expectation.Failures)
	}
	if rep.AnswersReceived == 0 {
		t.Errorf("dnsmasq answered nothing")
	}
	assertNothingLeft(t, testPrefix)
}
