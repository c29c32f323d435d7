package trace

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/lab"
)

// The scenarios with a local cache (lab/cache.go): pods ask a dnsmasq
// that forwards to the VIP. A pod's stall is then the forwarder's lost
// query's, named in its incident; the forwarder's incident lists the
// pods' back, and each loss is explained once.

// TestTraceCacheRace: the cache pod's upstream queries lose insertion
// races on the node (a silent drop on the forward path); the pods that
// asked those questions wait, though nothing lost their own queries.
// Every stalled lookup the lab measured is one upstream_lost incident of
// its pod, pointing at a forwarder incident (insert_race, in the cache's
// namespace) that lists it back.
func TestTraceCacheRace(t *testing.T) {
	tr := traceLossy(t, "cache-race")
	tr.requireExpectation(t)
	fwd := tr.checkForwarded(t, tr.rep.Topology.CacheNS())
	for _, inc := range fwd {
		if inc.Cause != correlate.CauseInsertRace {
			t.Errorf("forwarder incident %d: cause %s, want insert_race (the node's SNAT races)", inc.ID, inc.Cause)
		}
	}
}

// TestTraceStaleBackend: the VIP's one backend pod is replaced and
// conntrack is not flushed; the cache keeps its one query port, so its
// entry keeps sending to the gone pod. The forwarder's incident is
// stale_nat with the entry, the gone backend, the backend the rules point
// at now and the fix; the pods' stalls point at it.
func TestTraceStaleBackend(t *testing.T) {
	tr := traceScenario(t, "stale-backend")
	tr.requireExpectation(t)
	fwd := tr.checkForwarded(t, tr.rep.Topology.CacheNS())
	gone := netip.AddrPortFrom(lab.BackendPodAddr(0), 53)
	now := netip.AddrPortFrom(lab.BackendPodAddr(1), 53)
	stale := 0
	for _, inc := range fwd {
		if inc.Cause != correlate.CauseStaleNAT {
			t.Errorf("forwarder incident %d: cause %s, want stale_nat; the drop records of queries read:\n%s", inc.ID, inc.Cause, tr.dropRecords())
			continue
		}
		stale++
		s := inc.StaleNAT
		if s == nil {
			t.Errorf("stale_nat incident %d names no entry", inc.ID)
			continue
		}
		if s.Gone != gone || s.Entry.Dst != netip.AddrPortFrom(lab.VIP, 53) || s.Entry.Src.Port() != tr.rep.Topology.CacheQueryPort {
			t.Errorf("incident %d: entry %+v gone %s; want the cache's port %d to the VIP, sent to %s",
				inc.ID, s.Entry, s.Gone, tr.rep.Topology.CacheQueryPort, gone)
		}
		if s.NetNS != tr.rep.NodeNetNS {
			t.Errorf("incident %d: entry in netns %d, want the node's %d (unread: %s)", inc.ID, s.NetNS, tr.rep.NodeNetNS, s.Unread)
		}
		if !slices.Equal(s.Backends, []netip.AddrPort{now}) {
			t.Errorf("incident %d: backends now %v (from %q), want [%s]", inc.ID, s.Backends, s.BackendsFrom, now)
		}
		if !strings.Contains(s.Fix, "conntrack -D -p udp --orig-src "+lab.CacheAddr.String()) {
			t.Errorf("incident %d: fix %q does not delete the cache's entry", inc.ID, s.Fix)
		}
	}
	if stale == 0 {
		t.Errorf("no stale_nat incident")
	}
	// Nothing else lost in the cache's namespace: the NATed copies the
	// bridge floods back to it are the cache's own queries' losses.
	for _, inc := range tr.others[tr.rep.Topology.CacheNS()] {
		if inc.Cause != correlate.CauseStaleNAT {
			t.Errorf("cache incident %d: %s, want every loss there explained as the stale entry's", inc.ID, inc.Cause)
		}
	}
	if t.Failed() {
		t.Log(tr.text)
	}
}

// TestTraceNodeCache: the cache is the node's own process; its upstream
// queries clash at LOCAL_OUT, the send fails with EPERM and dnsmasq
// carries on at once (a SERVFAIL to its client, or a resend). Its losses
// are refused at send, none a stall of its own, each attributed; a pod
// that waited all the same (dnsmasq answered it only at its retry) has an
// incident of its own, one per stalled lookup.
func TestTraceNodeCache(t *testing.T) {
	tr := traceScenario(t, "node-cache")
	tr.requireExpectation(t)
	want := tr.rep.Stalls
	if tr.rep.Resolver == lab.ResolverGo {
		want = tr.rep.StallTimeout
	}
	if len(tr.incidents) != want {
		t.Errorf("%d incidents in the pods, want one per stalled lookup (per timeout for Go's resolver): %d\n%s", len(tr.incidents), want, tr.text)
	}
	for _, inc := range tr.others[tr.rep.Topology.NodeNS()] {
		if !inc.RefusedAtSend {
			t.Errorf("incident %d (%s, netns %d, %s): a stall, where no lookup waited\n%s", inc.ID, inc.Cause, inc.NetNS, inc.Comm, FormatIncident(inc))
		}
	}
	refused := tr.sum.RefusedAtSend[correlate.CauseInsertRace]
	if k := tr.nat.Kernel.InsertFailed; refused == 0 || uint64(refused) != k {
		t.Errorf("%d queries refused at send as insert_race, the kernel counted %d insert_failed", refused, k)
	}
}

// checkForwarded checks the stalls behind the cache in namespace fwdNS:
// one pod incident per stalled lookup, each upstream_lost and pointing at
// an incident of the forwarder, which lists it back. It returns the
// forwarder's incidents the pods point at.
func (tr *traced) checkForwarded(t *testing.T, fwdNS string) []*correlate.Incident {
	t.Helper()
	if tr.rep.Stalls == 0 {
		t.Fatalf("the lab measured no stalled lookup")
	}
	// Go's resolver asks again with a new socket and DNS id: each of its
	// timeouts is an incident of its own.
	want, per := tr.rep.Stalls, "stalled lookup"
	if tr.rep.Resolver == lab.ResolverGo {
		want, per = tr.rep.StallTimeout, "timeout waited out (Go's resolver)"
	}
	if got := len(tr.incidents); got != want {
		t.Errorf("%d pod incidents, want one per %s: %d (the trace follows)", got, per, want)
	}
	byID := map[uint64]*correlate.Incident{}
	for _, inc := range tr.others[fwdNS] {
		byID[inc.ID] = inc
	}
	var fwd []*correlate.Incident
	for _, inc := range tr.incidents {
		up := inc.Upstream
		if inc.Cause != correlate.CauseUpstreamLost || up == nil {
			t.Errorf("pod incident %d: cause %s, upstream %+v; want upstream_lost naming the forwarder's query", inc.ID, inc.Cause, up)
			continue
		}
		f, ok := byID[up.Incident]
		if !ok {
			t.Errorf("pod incident %d points at incident %d, not one of the forwarder's in %s", inc.ID, up.Incident, fwdNS)
			continue
		}
		// The pod names the loss it waited on, as known when its stall
		// ended; the forwarder's headline may come from a later loss
		// (stale-backend: the gone server's port first, its address
		// after).
		if f.Cause != up.Cause && !slices.ContainsFunc(f.Lost, func(p correlate.Packet) bool { return p.Cause == up.Cause }) {
			t.Errorf("pod incident %d: upstream cause %s, none of the forwarder's incident %d's losses (%s)", inc.ID, up.Cause, f.ID, f.Cause)
		}
		if !slices.ContainsFunc(f.Downstream, func(a correlate.Asker) bool { return a.Incident == inc.ID }) {
			t.Errorf("forwarder incident %d does not list pod incident %d among its askers %+v", f.ID, inc.ID, f.Downstream)
		}
		if !slices.Contains(fwd, f) {
			fwd = append(fwd, f)
		}
		// No loss explained twice: the pod's packets name the
		// forwarder's loss, not a race or drop of their own.
		for _, p := range inc.Lost {
			if p.Cause != correlate.CauseUpstreamLost {
				t.Errorf("pod incident %d: lost packet %s id %d of cause %s", inc.ID, p.QType, p.ID, p.Cause)
			}
		}
	}
	if t.Failed() {
		// What the correlator had to go on: every incident, and the
		// forwarder's queries upstream with their times.
		t.Logf("the trace:\n%s\nthe forwarder's queries:\n%s", tr.text, tr.cacheQueryRecords())
	}
	return fwd
}

// cacheQueryRecords is the query records of the cache's port, in the order
// read (by QID).
func (tr *traced) cacheQueryRecords() string {
	qids := slices.Sorted(maps.Keys(tr.cacheQueries))
	var b strings.Builder
	for _, q := range qids {
		b.WriteString(tr.cacheQueries[q] + "\n")
	}
	return b.String()
}
