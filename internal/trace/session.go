package trace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/ksym"
	"github.com/dnsrace/dnsrace/internal/podinfo"
	"github.com/dnsrace/dnsrace/internal/probe"
)

// Options configure a session.
type Options struct {
	Probe probe.Options
	// Out receives incidents (and the summary, when WriteSummary is
	// called); JSON selects JSON Lines.
	Out  io.Writer
	JSON bool
	// ReadyFile is written once every probe is attached.
	ReadyFile string
	// OnIncident is called for every incident, after it is written.
	OnIncident func(*correlate.Incident)
	// Correlate tunes the correlator (OnIncident, Counters, ReasonName,
	// Location and Wall are set by the session).
	Correlate correlate.Config
	// ProcRoot is where /proc is (for kubectl debug: /host/proc).
	ProcRoot string
	// Pods, when set, names the pod and container of every incident
	// before it is written.
	Pods *podinfo.Resolver
}

// Session is one running trace.
type Session struct {
	opts    Options
	tracer  *probe.Tracer
	corr    *correlate.Correlator
	ns      *nsCounters
	syms    *ksym.Table
	mu      sync.Mutex // guards corr and the counts below
	started time.Time
	ctNS    map[uint32]bool
	counts  map[string]int
	events  uint64
	// nextTick and lastEvent (CLOCK_MONOTONIC ns) pace the correlator's
	// Tick from the reader.
	nextTick, lastEvent uint64
	out                 *json.Encoder
	done                chan struct{}
	cancel              context.CancelFunc
	readErr             error
	stopped             bool
	monoOff             time.Duration
	// closed and lostAtStop (under mu): the tracer is closed, and the
	// events it had lost by then.
	closed     bool
	lostAtStop uint64
}

// Start loads the probes and starts reading.
func Start(opts Options) (*Session, error) {
	if opts.Out == nil {
		opts.Out = os.Stdout
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = "/proc"
	}
	t, err := probe.Open(opts.Probe)
	if err != nil {
		return nil, err
	}
	s := &Session{opts: opts, tracer: t, ctNS: map[uint32]bool{}, counts: map[string]int{}, done: make(chan struct{})}
	s.syms, _ = ksym.Load("")
	s.ns = newNSCounters(opts.ProcRoot)
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	s.started = time.Now()
	s.monoOff = time.Duration(s.started.UnixNano() - ts.Nano())
	cfg := opts.Correlate
	cfg.ReasonName = probe.DropReasonName
	cfg.Location = s.syms.Format
	cfg.Counters = s.ns
	cfg.Wall = func(mono uint64) time.Time { return time.Unix(0, int64(mono)+int64(s.monoOff)) }
	cfg.OnIncident = s.incident
	s.corr = correlate.New(cfg)
	if opts.JSON {
		s.out = json.NewEncoder(opts.Out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go s.read(ctx)
	go s.tick(ctx)
	if opts.ReadyFile != "" {
		if err := os.WriteFile(opts.ReadyFile, []byte("ready\n"), 0o644); err != nil {
			s.Stop()
			return nil, fmt.Errorf("writing ready file: %w", err)
		}
	}
	return s, nil
}

func (s *Session) read(ctx context.Context) {
	defer close(s.done)
	s.readErr = s.tracer.Read(ctx, func(e *event.Event) {
		s.mu.Lock()
		// ctNS is read by Conntrack while the session runs: it changes
		// under s.mu (a first sight is rare, so the baseline's cost
		// under the lock is too).
		if e.CT.Ptr != 0 && !s.ctNS[e.NetNS] {
			s.ctNS[e.NetNS] = true
			s.ns.Seen(e.NetNS)
		}
		s.events++
		s.corr.Handle(e)
		// Tick here, between events, while the lock is held anyway: a
		// ticker goroutine taking the lock for a Tick that walks every
		// query in flight stalls the reader while the ring fills.
		if e.TimeNs >= s.nextTick {
			s.corr.Tick(monoNow())
			s.nextTick = e.TimeNs + uint64(tickEvery)
		}
		s.lastEvent = e.TimeNs
		s.mu.Unlock()
	})
}

// tickEvery is how often the correlator classifies due drops and expires
// old state.
const tickEvery = 100 * time.Millisecond

func (s *Session) tick(ctx context.Context) {
	t := time.NewTicker(tickEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// Only when events are quiet: the reader ticks otherwise.
			now := monoNow()
			s.mu.Lock()
			if now >= s.lastEvent+uint64(tickEvery) {
				s.corr.Tick(now)
			}
			s.mu.Unlock()
		}
	}
}

func monoNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// incident runs under s.mu (the correlator calls it).
func (s *Session) incident(inc *correlate.Incident) {
	s.counts[inc.Cause]++
	if s.opts.Pods != nil {
		Attribute(s.opts.Pods, inc)
	}
	if s.out != nil {
		_ = s.out.Encode(inc)
	} else {
		WriteIncidentText(s.opts.Out, inc)
	}
	if s.opts.OnIncident != nil {
		s.opts.OnIncident(inc)
	}
}

// Live is what a running session has seen so far.
type Live struct {
	Events     uint64
	EventsLost uint64
	Queries    uint64
	Incidents  int
}

// Live reads the session's running counts (safe while it runs).
func (s *Session) Live() Live {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := Live{Events: s.events, Queries: s.corr.Stats().Queries}
	for _, n := range s.counts {
		l.Incidents += n
	}
	if s.closed {
		// The kernel's counter went with the programs: the last reading.
		l.EventsLost = s.lostAtStop
	} else {
		l.EventsLost = s.tracer.Lost()
	}
	return l
}

// Conntrack reads, now, the kernel's conntrack counters of every namespace
// where DNS flows were seen tracked, as deltas since that namespace's
// baseline (empty after Stop).
func (s *Session) Conntrack() map[uint32]ctstats.Counters {
	out := map[uint32]ctstats.Counters{}
	s.mu.Lock()
	ids := make([]uint32, 0, len(s.ctNS))
	for ns := range s.ctNS {
		ids = append(ids, ns)
	}
	s.mu.Unlock()
	for _, ns := range ids {
		if d, ok := s.ns.Delta(ns); ok {
			out[ns] = d
		}
	}
	return out
}

// Probes reports how each hook is traced.
func (s *Session) Probes() []probe.ProbeInfo { return s.tracer.Probes() }

// Summary is the reconciliation written at the end of a session.
type Summary struct {
	Type       string               `json:"type"` // "summary", or "checkpoint" (SIGUSR1)
	DurationS  float64              `json:"duration_s"`
	Incidents  map[string]int       `json:"incidents"`
	Kernel     ctstats.Counters     `json:"kernel"`
	Attributed correlate.Attributed `json:"attributed"`
	Mismatch   []string             `json:"mismatch"`
	Events     uint64               `json:"events"`
	EventsLost uint64               `json:"events_lost"`
	Malformed  uint64               `json:"events_malformed"`
	Queries    correlate.Stats      `json:"queries"`
	Namespaces []NamespaceSummary   `json:"namespaces"`
	Probes     []ProbeSummary       `json:"probes"`
}

// NamespaceSummary is the reconciliation of one namespace.
type NamespaceSummary struct {
	NetNS      uint32               `json:"netns"`
	Path       string               `json:"path,omitempty"`
	Kernel     ctstats.Counters     `json:"kernel"`
	Attributed correlate.Attributed `json:"attributed"`
	Late       bool                 `json:"baseline_late,omitempty"`
}

// ProbeSummary is one hook's tier in the summary.
type ProbeSummary struct {
	Hook     string `json:"hook"`
	Tier     string `json:"tier"`
	Program  string `json:"program,omitempty"`
	Attached bool   `json:"attached"`
	Error    string `json:"error,omitempty"`
}

// ProbeSummaries converts probe infos for output.
func ProbeSummaries(ps []probe.ProbeInfo) []ProbeSummary {
	out := make([]ProbeSummary, 0, len(ps))
	for _, p := range ps {
		ps := ProbeSummary{Hook: p.Hook, Tier: p.Tier.String(), Program: p.Program, Attached: p.Attached}
		if p.Err != nil {
			ps.Error = p.Err.Error()
		}
		out = append(out, ps)
	}
	return out
}

// Stop ends the session: it drains the ring buffer, classifies what is
// pending, detaches everything, and returns the reconciliation.
func (s *Session) Stop() *Summary {
	if s.stopped {
		return nil
	}
	s.stopped = true
	// Let events already in the kernel's ring reach the reader.
	time.Sleep(50 * time.Millisecond)
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	s.corr.Close(monoNow())
	sum := s.reconcile("summary")
	s.ns.close()
	s.lostAtStop, s.closed = sum.EventsLost, true
	_ = s.tracer.Close()
	if s.readErr != nil && !errors.Is(s.readErr, context.Canceled) {
		sum.Mismatch = append(sum.Mismatch, "reading events: "+s.readErr.Error())
	}
	return sum
}

// Checkpoint returns the reconciliation so far without stopping (type
// "checkpoint"). Drops younger than the correlator's classify delay (a
// quarter second) are not attributed yet and may show as a passing
// mismatch.
func (s *Session) Checkpoint() *Summary {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.corr.Tick(monoNow())
	return s.reconcile("checkpoint")
}

// reconcile builds the summary from what was attributed and the kernel's
// counter deltas of every namespace where DNS flows were tracked. Called
// under s.mu.
func (s *Session) reconcile(typ string) *Summary {
	sum := &Summary{
		Type: typ, DurationS: time.Since(s.started).Seconds(), Incidents: map[string]int{},
		Events: s.events, EventsLost: s.tracer.Lost(), Malformed: s.tracer.Malformed(),
		Queries: s.corr.Stats(), Probes: ProbeSummaries(s.tracer.Probes()), Mismatch: []string{},
	}
	for _, c := range correlate.Causes {
		sum.Incidents[c] = s.counts[c]
	}
	attrib := s.corr.Attributed()
	nss := map[uint32]bool{}
	for ns := range s.ctNS {
		nss[ns] = true
	}
	for ns := range attrib {
		nss[ns] = true
	}
	ids := make([]uint32, 0, len(nss))
	for ns := range nss {
		ids = append(ids, ns)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, ns := range ids {
		k, _ := s.ns.Delta(ns)
		a := attrib[ns]
		sum.Namespaces = append(sum.Namespaces, NamespaceSummary{NetNS: ns, Path: s.ns.path(ns), Kernel: k, Attributed: a, Late: s.ns.late[ns]})
		sum.Kernel.Add(k)
		sum.Attributed.InsertFailed += a.InsertFailed
		sum.Attributed.Drop += a.Drop
		sum.Attributed.EarlyDrop += a.EarlyDrop
		sum.Attributed.ClashResolve += a.ClashResolve
	}
	check := func(name string, kernel, attributed uint64) {
		if kernel != attributed {
			sum.Mismatch = append(sum.Mismatch, fmt.Sprintf("%s: kernel %d, attributed %d", name, kernel, attributed))
		}
	}
	check("insert_failed", sum.Kernel.InsertFailed, sum.Attributed.InsertFailed)
	check("drop", sum.Kernel.Drop, sum.Attributed.Drop)
	check("clash_resolve", sum.Kernel.ClashResolve, sum.Attributed.ClashResolve)
	if sum.EventsLost > 0 {
		sum.Mismatch = append(sum.Mismatch, fmt.Sprintf("%d events lost: the ring buffer was full", sum.EventsLost))
	}
	return sum
}

// Attribute fills the incident's pod, namespace and container from r: a
// host process that is in no pod gets pod "host" and no namespace.
func Attribute(r *podinfo.Resolver, inc *correlate.Incident) {
	p, ok := r.Lookup(inc.NetNS, inc.PID, inc.Cgroup)
	switch {
	case !ok:
	case p.Host:
		inc.Pod = "host"
	default:
		inc.Pod, inc.Namespace, inc.Container = p.Name, p.Namespace, p.Container
		if p.Name == "" {
			// The log folder is gone: the UID is all there is.
			inc.Pod = "uid:" + p.UID
		}
	}
}
