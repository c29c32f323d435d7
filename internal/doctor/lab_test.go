package doctor

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/dnsrace/dnsrace/internal/lab"
	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

func TestMain(m *testing.M) {
	// The lab's glibc clients re-execute the test binary to enter a pod.
	nsutil.MaybeExecHelper()
	os.Exit(m.Run())
}

func resultByID(rep Report, id string) Result {
	for _, r := range rep.Checks {
		if r.ID == id {
			return r
		}
	}
	return Result{}
}

// TestLiveAgainstLab points the live kube-proxy check at the node
// namespace of a standing `dnsrace lab` snat-port topology: its DNS VIP is
// DNATed at random to two backends and it SNATs without random-fully. The
// rules exist from the start, so no traffic is needed (the counters are
// TestLiveConntrackAgainstLab's).
func TestLiveAgainstLab(t *testing.T) {
	testutil.RequireRoot(t)
	sc, err := lab.LookupScenario("snat-port")
	if err != nil {
		t.Fatal(err)
	}
	topo := sc.Topology("dnsrace-td", sc.Pods)
	l, err := lab.Up(topo, sc.Server)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Down()
	rep, err := Run(context.Background(), Config{Root: "/", Live: true,
		NetNS: []string{nsutil.Path(topo.NodeNS())}, Checks: []string{"kube-proxy"}})
	if err != nil {
		t.Fatal(err)
	}
	kp := resultByID(rep, "kube-proxy")
	ev := strings.Join(kp.Evidence, "\n")
	if kp.Verdict != Warn {
		t.Errorf("kube-proxy verdict %s, want warn; evidence:\n%s", kp.Verdict, ev)
	}
	node := nsutil.Path("dnsrace-td-node")
	for _, want := range []string{node + " nftables: ip dnsrace/prerouting picks 1 of 2 DNS endpoints at random",
		node + " nftables: ip dnsrace/postrouting snat without --random-fully"} {
		if !strings.Contains(ev, want) {
			t.Errorf("kube-proxy evidence lacks %q:\n%s", want, ev)
		}
	}
}

// TestLiveConntrackAgainstLab: after a snat-port run raised insert_failed in
// the node namespace, the conntrack check reports it for that namespace.
func TestLiveConntrackAgainstLab(t *testing.T) {
	testutil.RequireRoot(t)
	sc, err := lab.LookupScenario("snat-port")
	if err != nil {
		t.Fatal(err)
	}
	topo := sc.Topology("dnsrace-td", sc.Pods)
	l, err := lab.Up(topo, sc.Server)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Down()
	// The race needs both CPUs at once: drive again (bounded) when a busy
	// machine gave it none, so the outcome does not depend on the load.
	var insertFailed uint64
	for drive := 1; drive <= 3 && insertFailed == 0; drive++ {
		labRep, err := l.Drive(context.Background(), lab.DriveConfig{Scenario: sc})
		if err != nil {
			t.Fatal(err)
		}
		insertFailed += labRep.Conntrack.InsertFailed
		t.Logf("drive %d: %+v", drive, labRep.Conntrack)
	}
	if insertFailed == 0 {
		t.Fatalf("three snat-port drives raised no insert_failed")
	}
	rep, err := Run(context.Background(), Config{Root: "/", Live: true,
		NetNS: []string{nsutil.Path(topo.NodeNS())}, Checks: []string{"conntrack"}})
	if err != nil {
		t.Fatal(err)
	}
	ct := resultByID(rep, "conntrack")
	ev := strings.Join(ct.Evidence, "\n")
	if ct.Verdict != Warn && ct.Verdict != Fail {
		t.Errorf("conntrack verdict %s after %d insert failures, want warn or fail:\n%s", ct.Verdict, insertFailed, ev)
	}
	// The node namespace's own count, not the host's (whose counters the
	// check reads too): at least what the drives raised there, the
	// namespace being new.
	node := nsutil.Path(topo.NodeNS())
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(node) + ` \(.*insert_failed=(\d+)`).FindStringSubmatch(ev)
	if m == nil {
		t.Fatalf("conntrack evidence does not show the node namespace's insert_failed:\n%s", ev)
	}
	if n, _ := strconv.ParseUint(m[1], 10, 64); n < insertFailed {
		t.Errorf("conntrack check read insert_failed=%d in %s, the lab's drives raised it by %d:\n%s", n, node, insertFailed, ev)
	}
	if !strings.Contains(ct.Summary, node+" insert_failed=") {
		t.Errorf("conntrack summary %q does not name %s's insert_failed", ct.Summary, node)
	}
}
