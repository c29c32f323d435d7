package trace

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/lab"
	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/probe"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// TestTraceReleasesNamespaces: pods whose DNS dnsrace tracked, some born
// before it started and some after, are deleted under a running tracer
// (`ip netns del` once their processes are gone); each namespace must then
// be freed by the kernel, which the test sees from the kernel side: the
// pod's veth on the node goes only when its namespace is freed. The
// summary keeps each released namespace's counters, and the reconciliation
// stays exact.
func TestTraceReleasesNamespaces(t *testing.T) {
	testutil.RequireRoot(t)
	const before, after = 3, 3
	sc, err := lab.LookupScenario("local-out") // NAT in each pod: a reader and links in each
	if err != nil {
		t.Fatal(err)
	}
	prefix := labPrefix + "r"
	_ = lab.Teardown(prefix)
	l, err := lab.Up(sc.Topology(prefix, before), sc.Server)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Down()

	var out bytes.Buffer
	s, err := Start(Options{Probe: probe.Options{Attach: attachTier(t, tier(t))}, Out: &out,
		NamespaceScanEvery: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			s.Stop()
		}
	}()

	pods := map[uint32]int{}
	for i := 0; i < before+after; i++ {
		if i >= before {
			if err := l.AddPod(i); err != nil {
				t.Fatal(err)
			}
		}
		ino, err := nsutil.Inode(l.Topology.PodNS(i))
		if err != nil {
			t.Fatal(err)
		}
		pods[ino] = i
	}
	// A pod born after the start gets its baseline when its first DNS
	// entry shows: ask once and wait for it, so the lab's measurement below
	// starts after the tracer's baseline.
	for ino, i := range pods {
		if i < before {
			continue
		}
		if err := lab.Ask(l.Topology.PodNS(i), lab.QName(i), 5*time.Second); err != nil {
			t.Fatalf("pod %d: %v", i, err)
		}
		waitFor(t, 10*time.Second, fmt.Sprintf("the tracer to see pod %d's DNS tracked", i), func() bool {
			_, ok := s.Conntrack()[ino]
			return ok
		})
	}
	rep, err := l.Drive(context.Background(), lab.DriveConfig{Scenario: sc, Duration: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Clients {
		if c.Lookups == 0 {
			t.Fatalf("a pod's client made no lookup: %+v", c)
		}
	}
	var held int
	s.Checkpoint(func(sum *Summary) { held = sum.NamespacesHeld })
	if held < len(pods) {
		t.Fatalf("the tracer holds %d namespaces while the %d pods live: the test would not see it let them go", held, len(pods))
	}

	for _, i := range pods {
		if err := l.DeletePod(i); err != nil {
			t.Fatal(err)
		}
	}
	// From the kernel's side: a pod's veth is on the node until the kernel
	// frees its namespace.
	for _, i := range pods {
		waitFor(t, 30*time.Second, fmt.Sprintf("pod %d's namespace to be freed (its veth gone from the node)", i), func() bool {
			ok, err := l.PodLinkExists(i)
			if err != nil {
				t.Fatal(err)
			}
			return !ok
		})
	}

	sum := s.Stop()
	stopped = true
	labNS := map[uint32]lab.NetNSConntrack{}
	for _, n := range rep.ConntrackByNetNS {
		labNS[n.NetNS] = n
	}
	got := map[uint32]NamespaceSummary{}
	for _, n := range sum.Namespaces {
		got[n.NetNS] = n
	}
	for ino, i := range pods {
		n, ok := got[ino]
		switch {
		case !ok:
			t.Errorf("pod %d (netns %d): not in the summary's namespaces", i, ino)
			continue
		case !n.Released:
			t.Errorf("pod %d (netns %d): in the summary, not released", i, ino)
		}
		k, m := n.Kernel, labNS[ino].Conntrack
		if k.InsertFailed != m.InsertFailed || k.Drop != m.Drop || k.ClashResolve != m.ClashResolve {
			t.Errorf("pod %d: counters kept at release %+v, the lab measured %+v", i, k, m)
		}
	}
	if sum.NamespacesReleased < uint64(len(pods)) {
		t.Errorf("%d namespaces released, want at least %d", sum.NamespacesReleased, len(pods))
	}
	if len(sum.Mismatch) > 0 {
		t.Errorf("reconciliation: %s", strings.Join(sum.Mismatch, "; "))
	}
	t.Logf("%d pods, lab conntrack %+v; summary: %d released, %d held, kernel %+v attributed %+v",
		len(pods), rep.Conntrack, sum.NamespacesReleased, sum.NamespacesHeld, sum.Kernel, sum.Attributed)
}

// waitFor polls cond every 20 ms until it holds, or fails t after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
