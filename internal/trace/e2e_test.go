package trace

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/dnsrace/dnsrace/internal/bpf"
	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/kconfig"
	"github.com/dnsrace/dnsrace/internal/lab"
	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/preemption"
	"github.com/dnsrace/dnsrace/internal/probe"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// labPrefix is unique per test process, so two runs of this suite on one
// machine never meet: a lab's prefix is its lock.
var labPrefix = fmt.Sprintf("dnsrace-tt%d", os.Getpid())

func TestMain(m *testing.M) {
	nsutil.MaybeExecHelper()
	os.Exit(m.Run())
}

// tier is the attach tier under test: DNSRACE_TEST_TIER (the VM harness
// sets it), default tracepoint, which works on every kernel dnsrace runs on.
func tier(t *testing.T) event.Tier {
	s := os.Getenv("DNSRACE_TEST_TIER")
	if s == "" {
		return event.TierTracepoint
	}
	tr, err := event.ParseTier(s)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// attachTier is the tier to ask the loader for to test tier want: want,
// or where the kernel cannot give fentry (5.10: no nf_conntrack BTF; arm64
// before 6.4: no ftrace direct calls) the loader's own choice, which a
// test then checks fell back to kprobe and said why.
func attachTier(t *testing.T, want event.Tier) event.Tier {
	if want == event.TierFentry {
		if limit := testutil.FentryLimit(); limit != "" {
			t.Logf("fentry is limited here (%s): tracing with the automatic tier choice", limit)
			return event.TierNone
		}
	}
	return want
}

type traced struct {
	rep       *lab.Report
	sum       *Summary
	incidents []*correlate.Incident // the lab's pods'
	// others are the incidents of the lab's other namespaces (its cache,
	// its node), by namespace name.
	others map[string][]*correlate.Incident
	pods   map[uint32]int // pod netns inode -> pod index
	text   string
	// nat is the reconciliation summed over every namespace whose
	// conntrack the scenario drives (the lab's Report.NATNetNS: the node,
	// or each pod when the NAT is in the sender's own namespace).
	nat NamespaceSummary
	// drops are the drop records of queries and the query records of
	// copies first seen at their drop, as read, with their queries;
	// cacheQueries the query records of the cache's port, by query (for
	// a failure's message).
	drops        []string
	dropQIDs     []uint64
	cacheQueries map[uint64]string
}

// dropRecords prints the drop records of queries the trace read, each
// after its cache query's record when it is one.
func (tr *traced) dropRecords() string {
	var b strings.Builder
	for i, l := range tr.drops {
		if q, ok := tr.cacheQueries[tr.dropQIDs[i]]; ok {
			b.WriteString(q + "\n  ")
		}
		b.WriteString(l + "\n")
	}
	return b.String()
}

func (tr *traced) count(cause string) int { return len(tr.byCause(cause)) }

// traceScenario runs a lab scenario with a tracing session attached.
func traceScenario(t *testing.T, name string) *traced {
	t.Helper()
	return traceScenarioUntil(t, name, false)
}

// traceLossy runs a scenario whose races lose queries: past its window,
// until a lookup stalled (at most lossyWindows windows). The race needs two
// CPUs at the same instant; on a busy machine a 20 s window has seen none.
func traceLossy(t *testing.T, name string) *traced {
	t.Helper()
	return traceScenarioUntil(t, name, true)
}

// maxDropRecords bounds the drop records a trace keeps for a failure's
// message.
const maxDropRecords = 400

// lossyWindows bounds how long a lossy scenario may drive while no lookup
// has stalled, in windows of the scenario (lab.DriveConfig.UntilStall).
const lossyWindows = 6

func traceScenarioUntil(t *testing.T, name string, untilStall bool) *traced {
	t.Helper()
	testutil.RequireRoot(t)
	sc, err := lab.LookupScenario(name)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		out bytes.Buffer
		tr  = &traced{pods: map[uint32]int{}, others: map[string][]*correlate.Incident{}, cacheQueries: map[uint64]string{}}
		ns  = map[uint32]string{} // the lab's other namespaces
		s   *Session
		// cachePort is the lab's cache's query port (0: none or any)
		cachePort uint16
	)
	want := tier(t)
	attach := attachTier(t, want)
	drive := lab.DriveConfig{Scenario: sc}
	if untilStall {
		drive.UntilStall = lossyWindows * sc.Duration
	}
	// Under emulation (the VM matrix) a real glibc lookup takes about a
	// second: too few flows for SNAT ports to run out. The harness then
	// asks for an in-process resolver with the same retry behaviour.
	if r := os.Getenv("DNSRACE_TEST_RESOLVER"); r != "" && sc.Resolver == lab.ResolverGlibc {
		drive.Resolver = r
		t.Logf("resolver %s instead of %s (DNSRACE_TEST_RESOLVER)", r, sc.Resolver)
	}
	rep, err := lab.Run(context.Background(), lab.RunConfig{
		Prefix: labPrefix,
		Drive:  drive,
		OnUp: func(l *lab.Lab) error {
			for i := 0; i < l.Topology.Pods; i++ {
				ino, err := nsutil.Inode(l.Topology.PodNS(i))
				if err != nil {
					return err
				}
				tr.pods[ino] = i
			}
			cachePort = l.Topology.CacheQueryPort
			for _, name := range []string{l.Topology.NodeNS(), l.Topology.CacheNS(), l.Topology.DNSNS()} {
				if ino, err := nsutil.Inode(name); err == nil {
					ns[ino] = name
				}
			}
			var err error
			s, err = Start(Options{
				Probe: probe.Options{Attach: attach},
				Out:   &out,
				OnRecord: func(e *event.Event) {
					cacheQuery := e.Kind == event.KindQuery && cachePort != 0 && e.Packet.Src.Port() == cachePort
					if !cacheQuery && e.Flags&event.FlagAtDrop == 0 && (e.Kind != event.KindDrop || e.Response()) {
						return
					}
					line := fmt.Sprintf("%s qid %x netns %d flags %#x ct %#x pkt %s id %d reason %d at %#x cpu %d t %d",
						e.Kind, e.QID, e.NetNS, e.Flags, e.CT.Ptr, e.Packet, e.DNS.ID, e.Reason, e.Location, e.CPU, e.TimeNs)
					mu.Lock()
					defer mu.Unlock()
					if cacheQuery {
						tr.cacheQueries[e.QID] = line
					} else if len(tr.drops) < maxDropRecords {
						tr.drops = append(tr.drops, line)
						tr.dropQIDs = append(tr.dropQIDs, e.QID)
					}
				},
				OnIncident: func(inc *correlate.Incident) {
					mu.Lock()
					defer mu.Unlock()
					// Other namespaces on the machine may have DNS
					// traffic too: keep the lab's pods' only.
					// The session reuses inc once this returns.
					if _, ours := tr.pods[inc.NetNS]; ours {
						tr.incidents = append(tr.incidents, inc.Clone())
					} else if name, ok := ns[inc.NetNS]; ok {
						tr.others[name] = append(tr.others[name], inc.Clone())
					}
				},
			})
			return err
		},
	})
	if s != nil && tr.sum == nil {
		tr.sum = s.Stop()
	}
	if err != nil {
		t.Fatal(err)
	}
	// make test runs every scenario here only, so its teardown is
	// checked here as TestScenarios checks it.
	if left := lab.Leftovers(labPrefix); len(left) > 0 {
		t.Errorf("the lab left behind: %v", left)
	}
	tr.rep = rep
	tr.text = out.String()
	byNS := map[uint32]NamespaceSummary{}
	for _, n := range tr.sum.Namespaces {
		byNS[n.NetNS] = n
	}
	labNS := map[uint32]lab.NetNSConntrack{}
	for _, n := range rep.ConntrackByNetNS {
		labNS[n.NetNS] = n
	}
	if len(rep.NATNetNS) == 0 {
		t.Fatal("the lab named no NAT namespace: the reconciliation below would check nothing")
	}
	for _, ns := range rep.NATNetNS {
		n, ok := byNS[ns]
		if !ok {
			t.Errorf("no reconciliation for the NAT namespace %d (%s)", ns, labNS[ns].Name)
			continue
		}
		// Only the lab drives these namespaces' conntrack: the tracer's
		// reading of the kernel must agree with the lab's, namespace by
		// namespace.
		if l := labNS[ns].Conntrack; n.Kernel.InsertFailed != l.InsertFailed || n.Kernel.ClashResolve != l.ClashResolve {
			t.Errorf("netns %d (%s): tracer read counters %+v, the lab measured %+v", ns, labNS[ns].Name, n.Kernel, l)
		}
		tr.nat.Kernel.Add(n.Kernel)
		tr.nat.Attributed.Add(n.Attributed)
	}
	// The tier that was asked for must be the one that traced; where fentry
	// is limited, the fallback (kprobe) with the reason fentry was skipped.
	preempts := preemption.Detect(os.Open, kconfig.Release()).Preempts
	for _, p := range tr.sum.Probes {
		// Where the kernel preempts kernel code, drops are read by the
		// perf tracepoint, whose program is never preempted.
		if p.Hook == "kfree_skb" && preempts {
			if !p.Attached || p.Program != bpf.DnsraceProgTpKfreeSkbPerf {
				t.Fatalf("drop hook where the kernel preempts: %s attached=%v, want %s", p.Program, p.Attached, bpf.DnsraceProgTpKfreeSkbPerf)
			}
			t.Logf("drop hook: %s", p.Program)
		}
		if p.Hook != "nf_conntrack_confirm" || want == event.TierTracepoint {
			continue
		}
		if attach == event.TierNone {
			if !p.Attached || p.Tier != event.TierKprobe.String() || p.Error == "" {
				t.Fatalf("confirm hook where fentry is limited: tier %s attached=%v error %q, want kprobe and why fentry was skipped", p.Tier, p.Attached, p.Error)
			}
			t.Logf("confirm hook fell back: %s (%s)", p.Tier, p.Error)
		} else if !p.Attached || p.Tier != want.String() {
			t.Fatalf("confirm hook: tier %s attached=%v, want %s", p.Tier, p.Attached, want)
		}
	}
	t.Logf("lab: lookups %d stalls %d timeouts %d lost %d conntrack %+v in netns %v; UDP no-port node %d pods %d; servers %+v; expectation met %v %v",
		rep.Lookups, rep.Stalls, rep.StallTimeout, rep.LostReplies, rep.Conntrack, rep.NATNetNS, rep.NodeUDP.NoPorts, rep.PodUDP.NoPorts, rep.Servers, rep.Expectation.Met, rep.Expectation.Failures)
	t.Logf("trace: %d incidents in the lab's pods; NAT netns kernel %+v attributed %+v; events lost %d; runs the kernel skipped %v",
		len(tr.incidents), tr.nat.Kernel, tr.nat.Attributed, tr.sum.EventsLost, tr.sum.RecursionMisses)
	if kf := tr.sum.KernelFlows; kf != nil {
		t.Logf("trace: queries %d, answered %d (kernel: flows started %d, answered %d, live %d, swept %d, evicted %d, refused %d)",
			tr.sum.Queries.Queries, tr.sum.Queries.Answered, kf.Started, kf.Answered, kf.Live, kf.Swept, kf.Evicted, kf.Refused)
	}
	if q := tr.sum.Queries; q.Evicted > 0 {
		// The tracer follows every namespace: another DNS flood on the
		// machine (a bench, a second test package run in parallel) can
		// push the lab's queries out of the correlator before they end.
		t.Logf("the correlator evicted %d of %d queries (over its cap): the counts below may miss lab queries", q.Evicted, q.Queries)
	}
	// Where packets were freed, with the reason: the rules' evidence,
	// worth seeing from every kernel (5.10 has only the location).
	freed := map[string]int{}
	for _, inc := range tr.incidents {
		for _, p := range inc.Lost {
			freed[fmt.Sprintf("%s %s reason %q", p.Cause, p.Location, p.Reason)]++
		}
	}
	for k, n := range freed {
		t.Logf("lost packets: %d × %s", n, k)
	}
	if tr.nat.Kernel.InsertFailed != rep.Conntrack.InsertFailed || tr.nat.Kernel.ClashResolve != rep.Conntrack.ClashResolve {
		t.Errorf("tracer read NAT netns counters %+v, the lab measured %+v", tr.nat.Kernel, rep.Conntrack)
	}
	// Every scenario: what was attributed equals what the kernel counted.
	k, a := tr.nat.Kernel, tr.nat.Attributed
	if k.InsertFailed != a.InsertFailed || k.Drop != a.Drop || k.ClashResolve != a.ClashResolve {
		t.Errorf("reconciliation: kernel insert_failed/drop/clash_resolve %d/%d/%d, attributed %d/%d/%d",
			k.InsertFailed, k.Drop, k.ClashResolve, a.InsertFailed, a.Drop, a.ClashResolve)
	}
	if tr.sum.EventsLost != 0 {
		t.Errorf("%d events lost", tr.sum.EventsLost)
	}
	return tr
}

func (tr *traced) byCause(cause string) []*correlate.Incident {
	var out []*correlate.Incident
	for _, inc := range tr.incidents {
		if inc.Cause == cause {
			out = append(out, inc)
		}
	}
	return out
}

// requireExpectation stops the test unless the lab's run showed its
// scenario's expected outcome (Report.Expectation, the lab's own ground
// truth: clients' stalls, kernel counters, servers' counts): otherwise the
// tracer's view would be compared with something that did not happen.
func (tr *traced) requireExpectation(t *testing.T) {
	t.Helper()
	if e := tr.rep.Expectation; !e.Met {
		t.Fatalf("the lab's %s run did not show its expected outcome (%s): %s", tr.rep.Scenario, e.Text, strings.Join(e.Failures, "; "))
	}
}

// checkStalls: the lab met its scenario's expectation and its clients
// waited out at least one resolver timeout; every timeout they waited out
// has exactly one incident of the expected cause, in the right pod, for the
// pod's name, with the packets it lost.
func (tr *traced) checkStalls(t *testing.T, cause string) {
	t.Helper()
	tr.requireExpectation(t)
	if tr.rep.Stalls == 0 || tr.rep.StallTimeout == 0 {
		t.Fatalf("the lab's clients measured %d stalled lookups, %d timeouts waited out: no %s stall to attribute", tr.rep.Stalls, tr.rep.StallTimeout, cause)
	}
	got := tr.byCause(cause)
	otherCause := false
	// One incident per stalled lookup, across its attempts; Go's resolver
	// asks again with a new socket and DNS id, so each of its timeouts is
	// an incident of its own.
	want, per := tr.rep.Stalls, "stalled lookups"
	if tr.rep.Resolver == lab.ResolverGo {
		want, per = tr.rep.StallTimeout, "timeouts waited out (Go's resolver)"
	}
	if len(got) != want {
		t.Errorf("%d %s incidents, want one per %s: %d (%d lookups stalled, %d timeouts)\n%s", len(got), cause, per, want, tr.rep.Stalls, tr.rep.StallTimeout, tr.text)
	}
	for _, inc := range got {
		pod, ok := tr.pods[inc.NetNS]
		if !ok {
			t.Errorf("incident %d in netns %d, not a pod's", inc.ID, inc.NetNS)
			continue
		}
		if len(inc.Lost) == 0 {
			t.Errorf("incident %d (%s): no lost packet", inc.ID, cause)
		}
		if want := strings.TrimSuffix(lab.QName(pod), "."); inc.QName != want {
			t.Errorf("incident %d: qname %q, want %q", inc.ID, inc.QName, want)
		}
		if s := inc.QType.String(); s != "A" && s != "AAAA" {
			t.Errorf("incident %d: qtype %q", inc.ID, inc.QType)
		}
		// Each lab scenario loses packets one way: a lost packet of
		// another cause is a query whose answer the tracer missed (as
		// the function tiers did for unconnected sockets until the send
		// key without a source address was looked up).
		for _, p := range inc.Lost {
			if p.Cause != cause {
				t.Errorf("incident %d (%s): lost packet %s id %d of cause %s", inc.ID, cause, p.QType, p.ID, p.Cause)
				otherCause = true
			}
		}
	}
	if otherCause {
		t.Logf("the trace's text:\n%s", tr.text)
	}
	for _, c := range correlate.Causes {
		if n := tr.count(c); c != cause && c != correlate.CauseClashResolved && n > 0 {
			t.Errorf("%d incidents of cause %s, want only %s\n%s", n, c, cause, tr.text)
		}
	}
	if cause != correlate.CauseInsertRace && tr.count(correlate.CauseInsertRace) > 0 {
		t.Errorf("%s scenario attributed to insert_race", cause)
	}
}

func TestTraceSNATPort(t *testing.T) {
	tr := traceLossy(t, "snat-port")
	tr.checkInsertRaces(t)
}

func TestTraceSameTuple(t *testing.T) {
	traceUntilClash(t, "same-tuple").checkRescued(t)
}

// traceUntilClash traces a scenario whose races the kernel rescues. The
// race needs two CPUs at the same instant. Under single-threaded emulation
// (the VM matrix: docs/vmtest.md, "The int3 oops") vCPUs take turns, and a
// 10 s run saw 0 to 3 clashes; the harness then allows more runs
// (DNSRACE_TEST_RACE_ATTEMPTS) until the kernel counted one. Every run is
// checked in full.
func traceUntilClash(t *testing.T, scenario string) *traced {
	t.Helper()
	tr := traceScenario(t, scenario)
	for run := 1; tr.nat.Kernel.ClashResolve == 0 && run < raceAttempts(t); run++ {
		t.Logf("run %d: the kernel counted no clash; running the scenario again", run)
		tr = traceScenario(t, scenario)
	}
	return tr
}

func TestTraceRuleDrop(t *testing.T) {
	tr := traceScenario(t, "rule-drop")
	tr.checkStalls(t, correlate.CauseRuleDrop)
}

// TestTraceTableFull: the scenario is about conntrack's drop counter. The
// node's kernel counted refused flows (the lab's reading), the tracer read
// the same count and attributed every one, and every stall is table_full.
func TestTraceTableFull(t *testing.T) {
	tr := traceScenario(t, "table-full")
	if tr.rep.Conntrack.Drop == 0 {
		t.Fatalf("the lab's NAT namespaces counted no conntrack drop (table filled with %d entries): no flow was refused", tr.rep.TableFilled)
	}
	if tr.nat.Kernel.Drop != tr.rep.Conntrack.Drop {
		t.Errorf("tracer read drop %d in the NAT namespaces, the lab measured %d", tr.nat.Kernel.Drop, tr.rep.Conntrack.Drop)
	}
	tr.checkStalls(t, correlate.CauseTableFull)
	if tr.nat.Attributed.Drop != tr.nat.Kernel.Drop {
		t.Errorf("attributed drop %d, kernel %d", tr.nat.Attributed.Drop, tr.nat.Kernel.Drop)
	}
}

// TestTraceWrongSource: the scenario is about replies that reach no
// socket. The kernel's UDP no-port counters of the node and the pods rose
// (the lab's reading), and every stall is reply_unmatched.
func TestTraceWrongSource(t *testing.T) {
	tr := traceScenario(t, "wrong-source")
	if tr.rep.NodeUDP.NoPorts+tr.rep.PodUDP.NoPorts == 0 {
		t.Fatal("the lab's node and pods counted no UDP no-port drop: no reply went astray")
	}
	tr.checkStalls(t, correlate.CauseReplyUnmatched)
}

// TestTraceUpstreamLoss: the backends ignored queries (their own count),
// and every stall is no_reply.
func TestTraceUpstreamLoss(t *testing.T) {
	tr := traceScenario(t, "upstream-loss")
	if tr.rep.Servers.Ignored == 0 {
		t.Fatal("the lab's backends ignored no query: nothing was lost upstream")
	}
	tr.checkStalls(t, correlate.CauseNoReply)
}

// raceAttempts is how many runs a scenario whose race is not guaranteed
// may take: DNSRACE_TEST_RACE_ATTEMPTS, default 1.
func raceAttempts(t *testing.T) int {
	return testutil.EnvInt(t, "DNSRACE_TEST_RACE_ATTEMPTS", 1, 1)
}

// checkInsertRaces: the scenario stalled lookups; every stall is a
// reply-tuple race that names the flow that won it, and every packet the
// kernel refused (insert_failed, drop) is attributed.
func (tr *traced) checkInsertRaces(t *testing.T) {
	t.Helper()
	if tr.rep.Stalls == 0 {
		t.Fatal("the lab produced no stall: nothing to attribute")
	}
	tr.checkStalls(t, correlate.CauseInsertRace)
	for _, inc := range tr.byCause(correlate.CauseInsertRace) {
		if inc.Race == nil || *inc.Race != correlate.RaceReplyClash {
			race := "none"
			if inc.Race != nil {
				race = *inc.Race
			}
			t.Errorf("incident %d: race %s, want reply_clash; %+v, winner %+v, lost %+v", inc.ID, race, *inc, inc.Winner, inc.Lost)
		}
		if inc.Winner == nil {
			t.Errorf("incident %d: no winner", inc.ID)
		}
	}
	if tr.nat.Attributed.InsertFailed != tr.nat.Kernel.InsertFailed || tr.nat.Kernel.InsertFailed == 0 {
		t.Errorf("attributed insert_failed %d, kernel %d; runs the kernel skipped %v", tr.nat.Attributed.InsertFailed, tr.nat.Kernel.InsertFailed, tr.sum.RecursionMisses)
	}
	if tr.nat.Attributed.Drop != tr.nat.Kernel.Drop {
		t.Errorf("attributed drop %d, kernel %d", tr.nat.Attributed.Drop, tr.nat.Kernel.Drop)
	}
}

// checkRescued: the kernel resolved clashes in the NAT namespaces and lost
// no answer (the lab's reading and its expectation); every clash is one
// clash_resolved incident, and any other incident is one the tracer made
// up.
func (tr *traced) checkRescued(t *testing.T) {
	t.Helper()
	if tr.rep.Conntrack.ClashResolve == 0 {
		t.Fatalf("the lab's NAT namespaces counted no clash_resolve: no race to attribute")
	}
	tr.requireExpectation(t)
	got := tr.count(correlate.CauseClashResolved)
	if uint64(got) != tr.nat.Kernel.ClashResolve || got == 0 {
		t.Errorf("%d clash_resolved incidents, kernel clash_resolve %d", got, tr.nat.Kernel.ClashResolve)
	}
	if tr.nat.Attributed.ClashResolve != tr.nat.Kernel.ClashResolve {
		t.Errorf("attributed clash_resolve %d, kernel %d", tr.nat.Attributed.ClashResolve, tr.nat.Kernel.ClashResolve)
	}
	for _, c := range correlate.Causes {
		if n := tr.count(c); c != correlate.CauseClashResolved && n > 0 {
			t.Errorf("%d incidents of cause %s, but no answer was lost\n%s", n, c, tr.text)
		}
	}
}

// TestTraceTargetPort: the backends listen on 5353 behind the VIP's port
// 53, so a query's destination port changes at the node's DNAT. Every stall
// is still a reply-tuple race with its winner, and every drop is
// attributed.
func TestTraceTargetPort(t *testing.T) {
	traceLossy(t, "target-port").checkInsertRaces(t)
}

// TestTraceLocalOut: the same-tuple race in the sender's own namespace
// (DNAT on OUTPUT, as for a host-network pod). Every clash the kernel
// resolved there is one clash_resolved incident.
func TestTraceLocalOut(t *testing.T) {
	traceUntilClash(t, "local-out").checkRescued(t)
}

// TestTraceLocalOutSNAT: SNAT to a narrow range in the senders' own
// namespaces; a drop there fails the send with EPERM, which the musl
// resolver ignores and waits out. Every stall and every insert_failed is
// attributed, in the pod where it happened.
func TestTraceLocalOutSNAT(t *testing.T) {
	traceLossy(t, "local-out-snat").checkInsertRaces(t)
}
