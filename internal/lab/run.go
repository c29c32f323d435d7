package lab

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/dnsserver"
	"github.com/dnsrace/dnsrace/internal/kconfig"
	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// Latency percentiles of all lookups, in milliseconds; in a survey result
// also their histogram.
type Latency struct {
	P50Ms     float64           `json:"p50_ms"`
	P99Ms     float64           `json:"p99_ms"`
	MaxMs     float64           `json:"max_ms"`
	Histogram *LatencyHistogram `json:"histogram,omitempty"`
}

// Expectation is whether a run showed its scenario's expected outcome.
type Expectation struct {
	Text     string   `json:"text"`
	Met      bool     `json:"met"`
	Failures []string `json:"failures,omitempty"`
}

// Report is the ground truth of one run. Every field is measured: by the
// clients, the servers, nft counters in the pods, or the kernel of the
// namespaces involved.
type Report struct {
	Scenario  string       `json:"scenario"`
	Kernel    string       `json:"kernel"`
	CPUs      int          `json:"cpus"`
	Started   time.Time    `json:"started"`
	DurationS float64      `json:"duration_s"`
	Resolver  string       `json:"resolver"`
	TimeoutS  float64      `json:"resolver_timeout_s"`
	Topology  Topology     `json:"topology"`
	Server    ServerConfig `json:"server"`
	// NodeNetNS is the inode of the node namespace, which forwards the
	// pods' queries (and NATs them, unless the NAT is local).
	NodeNetNS uint32 `json:"node_netns"`
	// NATNetNS are the inodes of every namespace whose conntrack the
	// scenario drives: the node's, or each pod's when the NAT is in the
	// sender's own namespace (Topology.LocalNAT). Conntrack sums them.
	NATNetNS     []uint32 `json:"nat_netns"`
	TableFilled  int      `json:"table_filled,omitempty"`
	Lookups      int      `json:"lookups"`
	LookupsOK    int      `json:"lookups_ok"`
	LookupsFail  int      `json:"lookups_failed"`
	Stalls       int      `json:"stalls"`
	StallTimeout int      `json:"stall_timeouts"`
	Crashed      int      `json:"clients_crashed"`
	Latency      Latency  `json:"latency"`
	// QueriesSent and AnswersReceived are the pods' kernel counts of DNS
	// packets out and in; LostReplies is their difference.
	QueriesSent     uint64 `json:"queries_sent"`
	AnswersReceived uint64 `json:"answers_received"`
	LostReplies     uint64 `json:"lost_replies"`
	Pairs           int    `json:"pairs,omitempty"`
	PairsLost       int    `json:"pairs_lost,omitempty"`
	AnswersLost     int    `json:"answers_lost,omitempty"`
	// Event is the scenario's mid-run event, when it has one.
	Event *EventReport `json:"event,omitempty"`
	// StaleEntries counts, at the end, the node's conntrack entries for
	// the VIP that still lead to a backend the VIP is no longer DNATed to
	// (scenarios that replace a backend).
	StaleEntries int `json:"stale_entries,omitempty"`
	// Conntrack is the delta of the per-CPU conntrack counters, summed
	// over NATNetNS; ConntrackByNetNS has each namespace's own delta.
	Conntrack        ctstats.Counters `json:"conntrack"`
	ConntrackByNetNS []NetNSConntrack `json:"conntrack_by_netns"`
	// ConntrackEntries is the entries in NATNetNS's tables at the end.
	ConntrackEntries uint32          `json:"conntrack_entries"`
	ConntrackMax     uint32          `json:"conntrack_max"`
	NodeUDP          UDPCounters     `json:"node_udp"`
	PodUDP           UDPCounters     `json:"pod_udp"`
	Servers          dnsserver.Stats `json:"servers"`
	Clients          []*ClientReport `json:"clients"`
	Expectation      Expectation     `json:"expectation"`
}

// EventReport is when a scenario's event happened, and how it went.
type EventReport struct {
	Name  string  `json:"name"`
	AtS   float64 `json:"at_s"`
	Error string  `json:"error,omitempty"`
}

// NetNSConntrack is one namespace's conntrack counter delta.
type NetNSConntrack struct {
	NetNS     uint32           `json:"netns"`
	Name      string           `json:"name"`
	Conntrack ctstats.Counters `json:"conntrack"`
}

// DriveConfig says how to drive traffic through a standing lab.
type DriveConfig struct {
	Scenario        Scenario
	Resolver        string
	Duration        time.Duration
	ResolverTimeout time.Duration // the resolvers' timeout; 5 s as glibc's
	PairWait        time.Duration // how long the pair client waits for answers
	// CrashClientAfter kills one glibc client process after that long (a
	// test hook).
	CrashClientAfter time.Duration
	// UntilStall, when longer than Duration, keeps the clients going past
	// Duration until a lookup has stalled, for at most UntilStall: a test
	// that checks how races are explained needs one, and on a busy
	// machine a lossy race can take longer than the scenario's window.
	UntilStall time.Duration
}

// Drive runs the clients of every pod for cfg.Duration and measures.
func (l *Lab) Drive(ctx context.Context, cfg DriveConfig) (*Report, error) {
	t := l.Topology
	if cfg.ResolverTimeout == 0 {
		cfg.ResolverTimeout = 5 * time.Second
	}
	if cfg.PairWait == 0 {
		cfg.PairWait = time.Second
	}
	if cfg.Resolver == "" {
		cfg.Resolver = cfg.Scenario.Resolver
	}
	if cfg.Duration == 0 {
		cfg.Duration = cfg.Scenario.Duration
	}
	ct, err := openNATReaders(t)
	if err != nil {
		return nil, err
	}
	defer ct.close()
	rep := &Report{
		Scenario: cfg.Scenario.Name, Kernel: kernelRelease(), CPUs: runtime.NumCPU(),
		Resolver: cfg.Resolver, TimeoutS: cfg.ResolverTimeout.Seconds(), Topology: t,
		Server: cfg.Scenario.Server,
	}
	rep.NodeNetNS, _ = nsutil.Inode(t.NodeNS())
	rep.NATNetNS = ct.inodes
	if cfg.Scenario.FillTable {
		if rep.TableFilled, err = fillTable(t); err != nil {
			return nil, err
		}
	}
	before, err := takeSnapshot(t, ct)
	if err != nil {
		return nil, err
	}
	var srvBefore dnsserver.Stats
	if l.servers != nil {
		srvBefore = l.servers.stats()
	}
	rep.Started = time.Now()
	window := max(cfg.Duration, cfg.UntilStall)
	stop, cancelStop := context.WithTimeout(ctx, window)
	defer cancelStop()
	var stalled atomic.Bool
	if window > cfg.Duration {
		go stopOnStall(stop, cancelStop, cfg.Duration, &stalled)
	}
	// A glibc lookup that loses every attempt takes attempts x timeout
	// plus the single-request retries: 4 timeouts bound it.
	hard, cancelHard := context.WithTimeout(ctx, window+4*cfg.ResolverTimeout+time.Second)
	defer cancelHard()
	var wg sync.WaitGroup
	if ev := cfg.Scenario.Event; ev != nil {
		rep.Event = &EventReport{Name: ev.Name}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-stop.Done():
				rep.Event.Error = "the clients stopped before it"
				return
			case <-time.After(ev.After):
			}
			rep.Event.AtS = time.Since(rep.Started).Seconds()
			if err := ev.Do(l); err != nil {
				rep.Event.Error = err.Error()
			}
		}()
	}
	rep.Clients = make([]*ClientReport, t.Pods)
	for i := range t.Pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep.Clients[i] = runClient(hard, stop, clientParams{
				topo: t, pod: i, resolver: cfg.Resolver, timeout: cfg.ResolverTimeout,
				pairWait: cfg.PairWait, crashAfter: cfg.CrashClientAfter, stalled: &stalled,
			})
		}()
	}
	wg.Wait()
	rep.DurationS = time.Since(rep.Started).Seconds()
	// Let answers in flight land before the counters are read.
	time.Sleep(100 * time.Millisecond)
	after, err := takeSnapshot(t, ct)
	if err != nil {
		return nil, err
	}
	for i := range after.ct {
		d := after.ct[i].Total.Sub(before.ct[i].Total)
		rep.ConntrackByNetNS = append(rep.ConntrackByNetNS, NetNSConntrack{NetNS: ct.inodes[i], Name: ct.names[i], Conntrack: d})
		rep.Conntrack.Add(d)
		rep.ConntrackEntries += after.ct[i].Entries
		rep.ConntrackMax = after.ct[i].Max
	}
	if t.BackendPods {
		if rep.StaleEntries, err = staleEntries(t, l.active); err != nil {
			return nil, err
		}
	}
	rep.NodeUDP = after.nodeUDP.sub(before.nodeUDP)
	rep.PodUDP = after.podUDP.sub(before.podUDP)
	rep.QueriesSent = after.sent - before.sent
	rep.AnswersReceived = after.answers - before.answers
	if rep.QueriesSent > rep.AnswersReceived {
		rep.LostReplies = rep.QueriesSent - rep.AnswersReceived
	}
	if l.servers != nil {
		s := l.servers.stats()
		rep.Servers = dnsserver.Stats{
			Received: s.Received - srvBefore.Received, Answered: s.Answered - srvBefore.Answered,
			Ignored: s.Ignored - srvBefore.Ignored, Malformed: s.Malformed - srvBefore.Malformed,
		}
	}
	rep.summarize()
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	rep.Expectation = Expectation{Text: cfg.Scenario.Expect, Met: true}
	if cfg.Scenario.Check != nil {
		rep.Expectation.Failures = cfg.Scenario.Check(rep)
		rep.Expectation.Met = len(rep.Expectation.Failures) == 0
	}
	return rep, nil
}

// stopOnStall ends stop once a lookup has stalled, from after on.
func stopOnStall(stop context.Context, cancel context.CancelFunc, after time.Duration, stalled *atomic.Bool) {
	select {
	case <-stop.Done():
		return
	case <-time.After(after):
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !stalled.Load() {
		select {
		case <-stop.Done():
			return
		case <-tick.C:
		}
	}
	cancel()
}

func (r *Report) summarize() {
	var all []time.Duration
	for _, c := range r.Clients {
		r.Lookups += c.Lookups
		r.LookupsOK += c.OK
		r.LookupsFail += c.Failed
		r.Stalls += c.Stalls
		r.StallTimeout += c.StallTimeouts
		r.Crashed += c.Crashed
		r.Pairs += c.Pairs
		r.PairsLost += c.PairsLost
		r.AnswersLost += c.AnswersLost
		all = append(all, c.durations...)
	}
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		i := int(p * float64(len(all)-1))
		return float64(all[i].Microseconds()) / 1000
	}
	r.Latency = Latency{P50Ms: pct(0.50), P99Ms: pct(0.99), MaxMs: pct(1)}
}

func kernelRelease() string {
	if r := kconfig.Release(); r != "" {
		return r
	}
	return "unknown"
}

// RunConfig is one complete run: build, drive, measure, tear down.
type RunConfig struct {
	Prefix string
	Pods   int // 0: the scenario's default
	Drive  DriveConfig
	// FailStep injects a failure at a build step (a test hook).
	FailStep string
	// OnUp is called once the lab stands and before traffic starts (the
	// tracer's end-to-end tests attach there).
	OnUp func(*Lab) error
}

// Run builds the scenario's lab, drives it, and always tears it down.
func Run(ctx context.Context, cfg RunConfig) (*Report, error) {
	sc := cfg.Drive.Scenario
	pods := cfg.Pods
	if pods == 0 {
		pods = sc.Pods
	}
	return RunTopology(ctx, sc.Topology(cfg.Prefix, pods), cfg)
}

// RunTopology is Run with an explicit topology (flags may change a
// scenario's default shape).
func RunTopology(ctx context.Context, t Topology, cfg RunConfig) (rep *Report, err error) {
	sc := cfg.Drive.Scenario
	if cfg.Drive.Duration == 0 {
		cfg.Drive.Duration = sc.Duration
	}
	l, err := up(t, sc.Server, cfg.FailStep)
	if err != nil {
		return nil, err
	}
	defer func() {
		if derr := l.Down(); derr != nil && err == nil {
			err = fmt.Errorf("tearing down lab: %w", derr)
		}
	}()
	if cfg.OnUp != nil {
		if err := cfg.OnUp(l); err != nil {
			return nil, err
		}
	}
	return l.Drive(ctx, cfg.Drive)
}
