package doctor

import (
	"context"
	"os"
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

// TestLiveAgainstLab points the live checks at the node namespace of a real
// `dnsrace lab` snat-port run: its DNS VIP is DNATed at random to two
// backends, it SNATs without random-fully, and its insert_failed counter
// rises while glibc clients race for 16 SNAT ports.
func TestLiveAgainstLab(t *testing.T) {
	testutil.RequireRoot(t)
	sc, err := lab.LookupScenario("snat-port")
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	labRep, err := lab.Run(context.Background(), lab.RunConfig{
		Prefix: "dnsrace-td",
		Drive:  lab.DriveConfig{Scenario: sc},
		OnUp: func(l *lab.Lab) error {
			// Counters are cumulative: read them after the traffic, so
			// run doctor from a second drive's end instead. Here only
			// check the rules, which exist from the start.
			r, err := Run(context.Background(), Config{Root: "/", Live: true,
				NetNS: []string{nsutil.Path(l.Topology.NodeNS())}, Checks: []string{"kube-proxy"}})
			rep = r
			return err
		},
	})
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
	if labRep.Conntrack.InsertFailed == 0 {
		t.Skip("the lab run raised no insert_failed: nothing for the conntrack check to see")
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
	labRep, err := l.Drive(context.Background(), lab.DriveConfig{Scenario: sc})
	if err != nil {
		t.Fatal(err)
	}
	if labRep.Conntrack.InsertFailed == 0 {
		t.Fatalf("snat-port raised no insert_failed: %+v", labRep.Conntrack)
	}
	rep, err := Run(context.Background(), Config{Root: "/", Live: true,
		NetNS: []string{nsutil.Path(topo.NodeNS())}, Checks: []string{"conntrack"}})
	if err != nil {
		t.Fatal(err)
	}
	ct := resultByID(rep, "conntrack")
	ev := strings.Join(ct.Evidence, "\n")
	if ct.Verdict != Warn && ct.Verdict != Fail {
		t.Errorf("conntrack verdict %s after %d insert failures, want warn or fail:\n%s", ct.Verdict, labRep.Conntrack.InsertFailed, ev)
	}
	if !strings.Contains(ev, topo.NodeNS()) || !strings.Contains(ev, "insert_failed") {
		t.Errorf("conntrack evidence does not show the node namespace's insert_failed:\n%s", ev)
	}
}
