package lab

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Scenario is one named way of making DNS lookups stall, with the outcome
// it must show on a kernel of this project's range (>= 5.6).
type Scenario struct {
	Name     string
	Summary  string
	Expect   string // the outcome, in words
	Resolver string // default resolver
	Pods     int    // default pods
	Duration time.Duration
	// Shape adjusts the default topology.
	Shape func(*Topology)
	// Server is how the backends behave.
	Server ServerConfig
	// FillTable fills the node's conntrack table before traffic starts.
	FillTable bool
	// Check returns the expectations a report does not meet.
	Check func(r *Report) []string
	// Event, if set, happens to the lab while the clients run.
	Event *Event
}

// Event is something done to a standing lab mid-run, as a node sees a
// rollout: After the clients started, Do.
type Event struct {
	Name  string
	After time.Duration
	Do    func(*Lab) error
}

func want(fails *[]string, ok bool, format string, args ...any) {
	if !ok {
		*fails = append(*fails, fmt.Sprintf(format, args...))
	}
}

// raceRescued: races happened and the kernel resolved every one (5.6+), so
// no answer was lost.
func raceRescued(r *Report) (f []string) {
	want(&f, r.Conntrack.ClashResolve > 0, "clash_resolve = %d, want > 0", r.Conntrack.ClashResolve)
	want(&f, r.Conntrack.InsertFailed == 0, "insert_failed = %d, want 0", r.Conntrack.InsertFailed)
	want(&f, r.AnswersLost == 0, "%d answers lost, want 0", r.AnswersLost)
	return f
}

// raceLost: reply tuples clashed, the kernel refused the losers, lookups
// stalled, and every lost query is one the kernel counted.
func raceLost(r *Report) (f []string) {
	want(&f, r.Stalls >= 1, "stalls = %d, want >= 1", r.Stalls)
	want(&f, r.Conntrack.InsertFailed > 0, "insert_failed = %d, want > 0", r.Conntrack.InsertFailed)
	want(&f, r.Conntrack.InsertFailed >= r.LostReplies, "insert_failed %d < lost queries %d", r.Conntrack.InsertFailed, r.LostReplies)
	return f
}

// Scenarios are the lab's named scenarios.
var Scenarios = []Scenario{
	{
		Name:     "same-tuple",
		Summary:  "A and AAAA from one socket at the same instant, DNAT to 2 backends at random",
		Expect:   "clash_resolve > 0, insert_failed = 0, no answer lost (kernel >= 5.6 rescues this race)",
		Resolver: ResolverPair, Pods: 1, Duration: 10 * time.Second,
		Check: raceRescued,
	},
	{
		Name:     "snat-port",
		Summary:  "many pods, SNAT to a 16-port range: different flows get the same reply tuple",
		Expect:   "insert_failed > 0 and >= lost queries, glibc lookups stall for one timeout",
		Resolver: ResolverGlibc, Pods: 4, Duration: 20 * time.Second,
		Shape: func(t *Topology) {
			t.SNAT, t.SNATPorts, t.UDPTimeout = true, PortRange{10000, 10015}, 1
		},
		Check: raceLost,
	},
	{
		Name:     "table-full",
		Summary:  "the node's conntrack table is full of assured entries: every new flow is refused",
		Expect:   "conntrack drop > 0, insert_failed = 0, lookups stall",
		Resolver: ResolverGlibc, Pods: 1, Duration: 12 * time.Second, FillTable: true,
		Check: func(r *Report) (f []string) {
			want(&f, r.Stalls >= 1, "stalls = %d, want >= 1", r.Stalls)
			want(&f, r.Conntrack.Drop > 0, "drop = %d, want > 0", r.Conntrack.Drop)
			want(&f, r.Conntrack.InsertFailed == 0, "insert_failed = %d, want 0", r.Conntrack.InsertFailed)
			return f
		},
	},
	{
		Name:     "rule-drop",
		Summary:  "a firewall rule on the node's forward path drops AAAA queries",
		Expect:   "lookups stall, conntrack counters (insert_failed, drop, early_drop) unchanged",
		Resolver: ResolverGlibc, Pods: 2, Duration: 12 * time.Second,
		Shape: func(t *Topology) { t.DropAAAA = true },
		Check: func(r *Report) (f []string) {
			want(&f, r.Stalls >= 1, "stalls = %d, want >= 1", r.Stalls)
			want(&f, r.Conntrack.InsertFailed == 0 && r.Conntrack.Drop == 0 && r.Conntrack.EarlyDrop == 0,
				"conntrack changed: insert_failed %d drop %d early_drop %d, want all 0",
				r.Conntrack.InsertFailed, r.Conntrack.Drop, r.Conntrack.EarlyDrop)
			return f
		},
	},
	{
		Name:     "wrong-source",
		Summary:  "backend 0 answers from another address: the reply is not reverse-NATed",
		Expect:   "lookups stall, UDP no-port drops where the unmatched replies land",
		Resolver: ResolverGlibc, Pods: 1, Duration: 12 * time.Second,
		Shape:  func(t *Topology) { t.SNAT, t.SNATPorts = true, PortRange{20000, 29999} },
		Server: ServerConfig{WrongSource: true},
		Check: func(r *Report) (f []string) {
			want(&f, r.Stalls >= 1, "stalls = %d, want >= 1", r.Stalls)
			want(&f, r.NodeUDP.NoPorts+r.PodUDP.NoPorts > 0, "UDP no-port drops = 0, want > 0")
			want(&f, r.Conntrack.InsertFailed == 0, "insert_failed = %d, want 0", r.Conntrack.InsertFailed)
			return f
		},
	},
	{
		Name:     "upstream-loss",
		Summary:  "the backends ignore 30% of queries: nothing is dropped on the node",
		Expect:   "lookups stall, servers ignored queries, no conntrack drop",
		Resolver: ResolverGlibc, Pods: 2, Duration: 12 * time.Second,
		Server: ServerConfig{IgnoreFraction: 0.3},
		Check: func(r *Report) (f []string) {
			want(&f, r.Stalls >= 1, "stalls = %d, want >= 1", r.Stalls)
			want(&f, r.Servers.Ignored > 0, "servers ignored %d queries, want > 0", r.Servers.Ignored)
			want(&f, r.Conntrack.InsertFailed == 0 && r.Conntrack.Drop == 0,
				"conntrack drops: insert_failed %d drop %d, want 0", r.Conntrack.InsertFailed, r.Conntrack.Drop)
			return f
		},
	},
	{
		Name:     "target-port",
		Summary:  "as snat-port, but the backends listen on 5353 behind the VIP's port 53 (OpenShift)",
		Expect:   "insert_failed > 0 and >= lost queries, glibc lookups stall for one timeout",
		Resolver: ResolverGlibc, Pods: 4, Duration: 20 * time.Second,
		Shape: func(t *Topology) {
			t.SNAT, t.SNATPorts, t.UDPTimeout, t.BackendPort = true, PortRange{10000, 10015}, 1, 5353
		},
		Check: func(r *Report) (f []string) {
			f = raceLost(r)
			want(&f, r.AnswersReceived > 0, "no answer from the backends on port %d", r.Topology.Port())
			return f
		},
	},
	{
		Name:     "local-out",
		Summary:  "as same-tuple, but DNAT in the sender's own namespace (host network); the node only routes",
		Expect:   "clash_resolve > 0 in the pods' netns, insert_failed = 0, no answer lost (kernel >= 5.6)",
		Resolver: ResolverPair, Pods: 1, Duration: 10 * time.Second,
		Shape: func(t *Topology) { t.LocalNAT = true },
		Check: raceRescued,
	},
	{
		Name:     "local-out-snat",
		Summary:  "NAT in each sender's own namespace, SNAT to 16 ports: reply tuples clash, the send gets EPERM",
		Expect:   "insert_failed > 0 and >= lost queries, musl lookups stall for one retry (glibc and Go retry at once)",
		Resolver: ResolverMusl, Pods: 4, Duration: 20 * time.Second,
		Shape: func(t *Topology) {
			t.LocalNAT, t.SNAT, t.SNATPorts, t.UDPTimeout = true, true, PortRange{10000, 10015}, 1
		},
		Check: raceLost,
	},
	{
		Name:     "cache-race",
		Summary:  "pods ask a dnsmasq cache pod that forwards to the VIP through a 16-port SNAT: its upstream queries clash",
		Expect:   "insert_failed > 0 on the node, lookups stall though no pod query is dropped",
		Resolver: ResolverGlibc, Pods: 4, Duration: 20 * time.Second,
		Shape: func(t *Topology) {
			t.Cache, t.SharedNames = CachePod, 2
			t.SNAT, t.SNATPorts, t.UDPTimeout = true, PortRange{10000, 10015}, 1
		},
		Check: func(r *Report) (f []string) {
			want(&f, r.Stalls >= 1, "stalls = %d, want >= 1", r.Stalls)
			want(&f, r.Conntrack.InsertFailed > 0, "insert_failed = %d, want > 0", r.Conntrack.InsertFailed)
			return f
		},
	},
	{
		Name:     "node-cache",
		Summary:  "pods ask a dnsmasq cache in the node's own namespace; its upstream queries clash at LOCAL_OUT and get EPERM",
		Expect:   "insert_failed > 0 on the node; the refused sends fail at once (dnsmasq answers SERVFAIL or resends), few lookups wait",
		Resolver: ResolverGlibc, Pods: 4, Duration: 15 * time.Second,
		Shape: func(t *Topology) {
			t.Cache, t.SharedNames = CacheNode, 2
			t.SNAT, t.SNATPorts, t.UDPTimeout = true, PortRange{10000, 10015}, 1
		},
		Check: func(r *Report) (f []string) {
			want(&f, r.Conntrack.InsertFailed > 0, "insert_failed = %d, want > 0", r.Conntrack.InsertFailed)
			want(&f, r.Stalls*10 < r.Lookups, "stalls = %d of %d lookups, want few: a send refused with EPERM is not waited out", r.Stalls, r.Lookups)
			return f
		},
	},
	{
		Name:     "stale-backend",
		Summary:  "a cache with one query port asks the VIP's one backend pod; the pod is replaced and conntrack not flushed",
		Expect:   "after the switch the cache's queries still go to the gone backend: lookups stall, a stale entry stays",
		Resolver: ResolverGlibc, Pods: 2, Duration: 20 * time.Second,
		Shape: func(t *Topology) {
			t.Cache, t.CacheQueryPort, t.SharedNames = CachePod, 5301, 2
			t.BackendPods, t.Backends = true, 1
		},
		Event: &Event{Name: "backend 0 replaced by backend 1, conntrack not flushed", After: 5 * time.Second,
			Do: func(l *Lab) error { return l.ReplaceBackend(0, 1) }},
		Check: func(r *Report) (f []string) {
			want(&f, r.Event != nil && r.Event.Error == "", "the backend was not replaced: %+v", r.Event)
			want(&f, r.Stalls >= 1, "stalls = %d, want >= 1", r.Stalls)
			want(&f, r.StaleEntries >= 1, "stale conntrack entries = %d, want >= 1", r.StaleEntries)
			return f
		},
	},
}

// ScenarioNames returns the names of all scenarios, in definition order.
func ScenarioNames() []string {
	names := make([]string, len(Scenarios))
	for i, s := range Scenarios {
		names[i] = s.Name
	}
	return names
}

// LookupScenario finds a scenario by name.
func LookupScenario(name string) (Scenario, error) {
	for _, s := range Scenarios {
		if s.Name == name {
			return s, nil
		}
	}
	known := ScenarioNames()
	sort.Strings(known)
	return Scenario{}, fmt.Errorf("unknown scenario %q (known: %s)", name, strings.Join(known, ", "))
}

// LookupScenarios finds each named scenario, in the order given.
func LookupScenarios(names []string) ([]Scenario, error) {
	out := make([]Scenario, 0, len(names))
	for _, n := range names {
		sc, err := LookupScenario(n)
		if err != nil {
			return nil, err
		}
		out = append(out, sc)
	}
	return out, nil
}

// Topology returns the scenario's topology for the given prefix and pods.
func (s Scenario) Topology(prefix string, pods int) Topology {
	t := Topology{Prefix: prefix, Pods: pods, Backends: 2}
	if s.Shape != nil {
		s.Shape(&t)
	}
	return t
}
