package trace

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"sort"
	"sync"
	"sync/atomic"
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
	// called); JSON selects JSON Lines. Incidents are buffered and written
	// at each tick (every tickEvery at most) and at Stop, so a flood of
	// them costs a write(2) per buffer, not one each.
	Out  io.Writer
	JSON bool
	// ReadyFile is written once every probe is attached.
	ReadyFile string
	// OnIncident is called for every incident, after it is formatted for
	// Out (it reaches Out at the next tick), on the session's writer
	// goroutine: one at a time, in order. The incident is the session's
	// again once it returns (its memory holds a later stall): keep a Clone.
	OnIncident func(*correlate.Incident)
	// Correlate tunes the correlator (OnIncident, Counters, ReasonName,
	// Symbol and Wall are set by the session).
	Correlate correlate.Config
	// ProcRoot is where /proc is (for kubectl debug: /host/proc).
	ProcRoot string
	// Pods, when set, names the pod and container of every incident
	// before it is written.
	Pods *podinfo.Resolver
	// ShowResolved lists every race the kernel rescued in the text
	// output, instead of summing them up per pod every 10 s.
	ShowResolved bool
	// ReaderNice, when not 0, is the nice value of the reader's thread
	// and of the thread that drains the ring buffer for it
	// (probe.Options.ReaderNice; each is locked to its thread): below 0
	// they get more of a CPU their floods share with more runnable
	// threads than there are CPUs (needs CAP_SYS_NICE; Start fails if it
	// cannot be set).
	ReaderNice int
	// OnRecord, when set, sees every record before the correlator does,
	// on the reader goroutine (tests: the records behind an incident).
	OnRecord func(*event.Event)
	// NamespaceScanEvery is how often the namespaces something other than
	// dnsrace holds are looked for, so the others are let go
	// (DefaultNamespaceScan when 0).
	NamespaceScanEvery time.Duration
}

// Session is one running trace.
//
// Concurrency: one goroutine, the reader, owns the correlator and every
// count it feeds: it handles events and ticks the correlator. At every tick
// it hands the incidents that closed, with a snapshot of its counts, to a
// second goroutine, the writer, which names their pods, formats and writes
// them, calls OnIncident, and then publishes the snapshot (atomic pointer)
// that the progress line and /metrics read: an incident a snapshot counts
// has been written. A checkpoint (SIGUSR1) is written by the writer too,
// between two ticks' output. The writer is a thread of its own because a
// flood of incidents (tens of thousands a second when a node drops
// queries) must not slow the reader below the ring buffer's rate. Nothing
// else ever waits for the reader or holds a lock it needs; it waits for
// the writer only when outQueue ticks of output are queued. The records it
// handled are counted there too, and published with the snapshot (an
// atomic add per record cost a tenth of handling an answer). Stop waits for the reader to finish draining, hands
// the writer the rest, waits for it, and then owns everything.
type Session struct {
	opts    Options
	tracer  *probe.Tracer
	ns      *namespaces
	syms    *ksym.Table
	started time.Time
	monoOff time.Duration

	// Reader-owned (Stop's once the reader is done).
	corr     *correlate.Correlator
	counts   map[string]int // incidents by cause, but those refused at send
	refused  map[string]int // incidents refused at send, by cause
	ctNS     map[uint32]bool
	nextTick uint64                // CLOCK_MONOTONIC ns of the next Tick between events
	closing  []*correlate.Incident // closed since the last tick
	events   uint64                // records handled
	readErr  error
	// The netfilter program's namespaces (watch.go): why some could not
	// be watched.
	watchErrs []string
	// unwatched: per namespace watched only once its DNS showed (not at
	// start), the races its clash_resolve counted before: rescued, no
	// query lost, but no query can be named for them.
	unwatched map[uint32]uint64
	// Namespaces let go of (release.go): the newest listed, older ones
	// summed; releasedCount counts every one dnsrace held something of.
	released        []NamespaceSummary
	releasedEarlier ReleasedSum
	releasedCount   uint64
	scans           chan map[uint32]string // the scanner's living namespaces
	warm            chan podKey            // askers to name early (namePods)

	// Writer-owned (Stop's once the writer is done).
	nat   *natReader // stale_nat incidents' rules and fix
	jsonl []byte     // --json: each incident's line is built here
	text  *TextWriter
	buf   *bufio.Writer // under jsonl or text; flushed at each tick
	outq  chan outBatch
	// written: each tick's incidents the writer is done with, back to the
	// reader, which gives them to the correlator to reuse (Recycle) and
	// gathers the next tick's in the slice
	written chan []*correlate.Incident
	cpq     chan func() // checkpoints, written between two ticks' output
	wdone   chan struct{}

	snap   atomic.Pointer[snapshot]
	done   chan struct{}
	cancel context.CancelFunc

	stopOnce sync.Once
	summary  *Summary
	// closed: the tracer is closed; lostAtStop and missedAtStop are the
	// kernel's counts read just before (they went with the programs).
	closed       atomic.Bool
	lostAtStop   atomic.Uint64
	missedAtStop atomic.Pointer[map[string]uint64]
}

// outBatch is one tick's output, from the reader to the writer.
type outBatch struct {
	incidents []*correlate.Incident
	// release: the text writer may let go of lines held until now (no
	// stall older than oldest is still open).
	release     bool
	oldest, now time.Time
	snap        *snapshot // published once the incidents are written
}

// outQueue is how many ticks of output may wait for the writer.
const outQueue = 16

// snapshot is the reader's state as of its last tick, for everyone else.
type snapshot struct {
	events     uint64
	stats      correlate.Stats
	counts     map[string]int
	refused    map[string]int
	attributed map[uint32]correlate.Attributed
	ctNS       []uint32
	watchErrs  []string
	unwatched  map[uint32]uint64
	released   []NamespaceSummary // never changed once snapshot: see letGo
	earlier    ReleasedSum
	nReleased  uint64
}

// Start loads the probes and starts reading.
func Start(opts Options) (*Session, error) {
	if opts.Out == nil {
		opts.Out = os.Stdout
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = "/proc"
	}
	if opts.Probe.ProcRoot == "" {
		opts.Probe.ProcRoot = opts.ProcRoot
	}
	opts.Probe.ReaderNice = opts.ReaderNice
	t, err := probe.Open(opts.Probe)
	if err != nil {
		return nil, err
	}
	s := &Session{opts: opts, tracer: t, ctNS: map[uint32]bool{}, counts: map[string]int{}, refused: map[string]int{},
		done: make(chan struct{}),
		outq: make(chan outBatch, outQueue), written: make(chan []*correlate.Incident, outQueue), cpq: make(chan func()), wdone: make(chan struct{}),
		scans: make(chan map[uint32]string, 1)}
	s.syms, _ = ksym.Load("")
	s.ns = newNamespaces(opts.ProcRoot)
	s.nat = &natReader{ns: s.ns, byKey: map[correlate.Flow]*natRead{}, ctNSs: func() []uint32 { return s.snap.Load().ctNS }}
	s.watchNAT()
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	s.started = time.Now()
	s.monoOff = time.Duration(s.started.UnixNano() - ts.Nano())
	cfg := opts.Correlate
	cfg.ReasonName = probe.DropReasonName
	cfg.Symbol = s.syms.Lookup
	cfg.Counters = s.ns
	cfg.Wall = s.wall
	cfg.OnIncident = s.incident
	cfg.OnStaleNAT = s.nat.request
	if opts.Pods != nil {
		s.warm = make(chan podKey, 1024)
		cfg.OnClosed = s.warmPod
		go s.namePods()
	}
	owners := &addrOwners{ns: s.ns}
	if cfg.AddrOwner == nil {
		cfg.AddrOwner = owners.owner
	}
	if cfg.UpstreamTCP == nil {
		cfg.UpstreamTCP = owners.upstreamTCP
	}
	s.corr = correlate.New(cfg)
	s.buf = bufio.NewWriterSize(opts.Out, outBufferSize)
	if !opts.JSON {
		s.text = NewTextWriter(s.buf, opts.ShowResolved)
	}
	s.snap.Store(s.snapshot())
	go s.write()
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	scanEvery := opts.NamespaceScanEvery
	if scanEvery <= 0 {
		scanEvery = DefaultNamespaceScan
	}
	go s.scanNamespaces(ctx, scanEvery)
	niced := make(chan error, 1)
	go s.read(ctx, niced)
	if err := <-niced; err != nil {
		s.Stop()
		return nil, err
	}
	if opts.ReadyFile != "" {
		if err := os.WriteFile(opts.ReadyFile, []byte("ready\n"), 0o644); err != nil {
			s.Stop()
			return nil, fmt.Errorf("writing ready file: %w", err)
		}
	}
	return s, nil
}

// tickEvery is how often the correlator classifies due drops and expires
// old state, how often buffered incidents are written, and how often the
// snapshot is published.
const tickEvery = probe.IdleEvery

// outBufferSize holds about a hundred JSON incidents.
const outBufferSize = 64 << 10

// read is the reader. It reports on niced whether its thread took
// Options.ReaderNice before it reads anything.
func (s *Session) read(ctx context.Context, niced chan<- error) {
	defer close(s.done)
	if n := s.opts.ReaderNice; n != 0 {
		restore, err := probe.NiceThread(n)
		if err != nil {
			niced <- fmt.Errorf("setting the reader's nice value to %d: %w", n, err)
			return
		}
		defer restore()
	}
	niced <- nil
	s.readErr = s.tracer.Read(ctx, s.handle, func() { s.tick(monoNow()) })
}

// handle runs on the reader for every event.
func (s *Session) handle(e *event.Event) {
	s.events++
	if e.Kind == event.KindCTNetNS {
		// DNS is connection-tracked here: reconcile its counters.
		if !s.ctNS[e.NetNS] {
			s.ctNS[e.NetNS] = true
			s.ns.Seen(e.NetNS)
			s.watchLate(e.NetNS)
		}
		return
	}
	if s.opts.OnRecord != nil {
		s.opts.OnRecord(e)
	}
	s.corr.Handle(e)
	// Tick between events too: under load the ring is never empty. Such a
	// tick runs at the record's time, not the clock's: a reader behind
	// the kernel has not read what happened since, so a drop is due once
	// the records of ClassifyDelay after it are read (the winner's among
	// them), and each tick has tickEvery of records' work, not all that
	// piled up while the reader was behind. Only an idle tick (the ring
	// empty) runs at the clock's time.
	if e.TimeNs >= s.nextTick {
		s.tick(e.TimeNs)
	}
}

// tick runs on the reader.
func (s *Session) tick(now uint64) {
	s.takeWritten()
	s.corr.Tick(now)
	s.takeScan()
	s.nextTick = now + uint64(tickEvery)
	s.handOver(now, true)
}

// handOver gives the writer the incidents closed since the last tick and
// a snapshot of the counts that include them.
func (s *Session) handOver(now uint64, release bool) {
	b := outBatch{incidents: s.closing, snap: s.snapshot(), now: s.wall(now), release: release && s.text != nil}
	if b.release {
		if o := s.corr.OldestOpen(); o != 0 {
			b.oldest = s.wall(o)
		}
	}
	s.closing = nil
	s.outq <- b
}

// takeWritten gives the correlator back the incidents the writer is done
// with: a flood of drops then reuses their stalls instead of allocating one
// per lookup.
func (s *Session) takeWritten() {
	for {
		select {
		case done := <-s.written:
			for _, inc := range done {
				s.corr.Recycle(inc)
			}
			if s.closing == nil {
				clear(done)
				s.closing = done[:0]
			}
		default:
			return
		}
	}
}

// write is the writer: it writes each tick's incidents, flushes, and
// then publishes that tick's snapshot. Checkpoints come in between, when
// the buffer is empty. Then it hands back the incidents it no longer
// reads (the text writer holds some to write them in order).
func (s *Session) write() {
	defer close(s.wdone)
	for {
		select {
		case b, ok := <-s.outq:
			if !ok {
				return
			}
			for _, inc := range b.incidents {
				s.writeIncident(inc)
			}
			if b.release {
				s.text.Release(b.oldest, b.now)
			}
			_ = s.buf.Flush()
			s.snap.Store(b.snap)
			done := b.incidents
			if s.text != nil {
				done = s.text.TakeDone(done[:0])
			}
			if len(done) > 0 {
				select {
				case s.written <- done:
				default: // the reader is behind: they are the GC's
				}
			}
		case cp := <-s.cpq:
			cp()
		}
	}
}

func (s *Session) writeIncident(inc *correlate.Incident) {
	if inc.StaleNAT != nil {
		s.nat.complete(inc.StaleNAT)
	}
	if s.opts.Pods != nil {
		Attribute(s.opts.Pods, inc)
	}
	if s.opts.JSON {
		s.jsonl = append(inc.AppendJSON(s.jsonl[:0]), '\n')
		_, _ = s.buf.Write(s.jsonl)
	} else {
		s.text.Incident(inc)
	}
	if s.opts.OnIncident != nil {
		s.opts.OnIncident(inc)
	}
}

// podKey is an incident's asker, as the pod resolver looks it up.
type podKey struct {
	netns, pid uint32
	cgroup     uint64
}

// warmPod has an asker's pod looked up now, on the reader, as its incident
// closes: it is written ForwarderGrace later, when its pod may be gone (a
// pod's last lookup). A flood of stalls overflows it: their pods are named
// as they are written.
func (s *Session) warmPod(netns, pid uint32, cgroup uint64) {
	select {
	case s.warm <- podKey{netns, pid, cgroup}:
	default:
	}
}

// namePods looks the askers up, and the resolver keeps what it finds for
// the writer.
func (s *Session) namePods() {
	for k := range s.warm {
		s.opts.Pods.Lookup(k.netns, k.pid, k.cgroup)
	}
}

// wall converts a CLOCK_MONOTONIC time to wall time.
func (s *Session) wall(mono uint64) time.Time {
	return time.Unix(0, int64(mono)+int64(s.monoOff))
}

// snapshot copies what others read (reader-owned).
func (s *Session) snapshot() *snapshot {
	sn := &snapshot{events: s.events, stats: s.corr.Stats(), counts: make(map[string]int, len(s.counts)),
		attributed: s.corr.Attributed(), ctNS: make([]uint32, 0, len(s.ctNS))}
	for c, n := range s.counts {
		sn.counts[c] = n
	}
	sn.refused = maps.Clone(s.refused)
	for ns := range s.ctNS {
		sn.ctNS = append(sn.ctNS, ns)
	}
	sn.watchErrs = append([]string(nil), s.watchErrs...)
	sn.unwatched = maps.Clone(s.unwatched)
	sn.released, sn.earlier, sn.nReleased = s.released, s.releasedEarlier, s.releasedCount
	return sn
}

func monoNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// incident runs on the reader (the correlator calls it): the writer
// gets it at the next tick.
func (s *Session) incident(inc *correlate.Incident) {
	if inc.RefusedAtSend {
		for _, p := range inc.Lost {
			s.refused[p.Cause]++
		}
	} else {
		s.counts[inc.Cause]++
	}
	s.closing = append(s.closing, inc)
}

// Live is what a running session has seen so far.
type Live struct {
	Events     uint64 // records read
	EventsLost uint64 // records lost to a full ring buffer
	Queries    uint64 // DNS queries seen
	Answered   uint64
	InFlight   int    // waiting for an answer
	Untracked  uint64 // queries the kernel's full flow table could not follow
	Stalls     int    // incidents but rescued races
	Rescued    int    // races the kernel rescued
}

// Live reads the session's running counts; it never waits for the reader
// (records read, queries and incidents are as of its last tick).
func (s *Session) Live() Live {
	sn := s.snap.Load()
	l := Live{Events: sn.events, Queries: sn.stats.Queries, Answered: sn.stats.Answered,
		InFlight: sn.stats.InFlight, Untracked: sn.stats.Untracked, EventsLost: s.lost(), Rescued: sn.counts[correlate.CauseClashResolved]}
	for c, n := range sn.counts {
		if c != correlate.CauseClashResolved {
			l.Stalls += n
		}
	}
	return l
}

// lost is the kernel's count of records it could not deliver.
func (s *Session) lost() uint64 {
	if s.closed.Load() {
		return s.lostAtStop.Load()
	}
	return s.tracer.Lost()
}

// Missed is, by program, the runs of dnsrace's programs the kernel
// skipped because another BPF program was running on that CPU (every
// program while tracing, only those with misses after Stop; nil if the
// kernel would not say).
func (s *Session) Missed() map[string]uint64 {
	if s.closed.Load() {
		return *s.missedAtStop.Load()
	}
	m, err := s.tracer.Missed()
	if err != nil {
		return nil
	}
	return m
}

// Conntrack reads, now, the kernel's conntrack counters of every namespace
// where DNS flows were seen tracked, as deltas since that namespace's
// baseline (empty after Stop).
func (s *Session) Conntrack() map[uint32]ctstats.Counters {
	out := map[uint32]ctstats.Counters{}
	for _, ns := range s.snap.Load().ctNS {
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
	Type      string         `json:"type"` // "summary", or "checkpoint" (SIGUSR1)
	DurationS float64        `json:"duration_s"`
	Incidents map[string]int `json:"incidents"`
	// RefusedAtSend counts, by cause, the queries lost inside their send
	// (the sender was told) that nobody waited on: resent at once, or not
	// asked again at all (incidents with refused_at_send, not counted in
	// Incidents).
	RefusedAtSend map[string]int       `json:"refused_at_send,omitempty"`
	Kernel        ctstats.Counters     `json:"kernel"`
	Attributed    correlate.Attributed `json:"attributed"`
	Mismatch      []string             `json:"mismatch"`
	Events        uint64               `json:"events"`
	EventBytes    uint64               `json:"event_bytes"`
	EventsLost    uint64               `json:"events_lost"`
	Malformed     uint64               `json:"events_malformed"`
	// KernelFlows are the kernel side's flow counts (at the end only).
	KernelFlows *KernelFlows       `json:"kernel_flows,omitempty"`
	Queries     correlate.Stats    `json:"queries"`
	Namespaces  []NamespaceSummary `json:"namespaces"`
	Probes      []ProbeSummary     `json:"probes"`
	// PcapErrors counts incidents --pcap could not write (set by the
	// caller that owns the pcap file).
	PcapErrors uint64 `json:"pcap_write_errors"`
	// ClashBeforeWatched: of Attributed.ClashResolve, the races counted
	// from the kernel's counter of namespaces watched late (see
	// NamespaceSummary).
	ClashBeforeWatched uint64 `json:"clash_resolve_before_watched,omitempty"`
	// NetfilterErrors say why the netfilter program (tracepoint tier,
	// 6.4+) could not be linked in a namespace: merged clash losers there
	// are not seen.
	NetfilterErrors []string `json:"netfilter_errors,omitempty"`
	// NamespacesHeld counts the namespaces dnsrace holds now (a counter
	// reader or the netfilter program's links: where DNS is tracked and
	// something else holds the namespace too); NamespacesReleased those it
	// let go of once nothing else held them. Released ones are listed in
	// Namespaces (Released), the newest 1,024; ReleasedEarlier sums the
	// older ones.
	NamespacesHeld     int          `json:"namespaces_held"`
	NamespacesReleased uint64       `json:"namespaces_released"`
	ReleasedEarlier    *ReleasedSum `json:"namespaces_released_earlier,omitempty"`
	// RecursionMisses are, by program, the runs the kernel skipped because
	// another BPF program was running on that CPU: hook calls dnsrace never
	// saw (only programs with misses; see probe.Tracer.Missed for which
	// kernels count them).
	RecursionMisses map[string]uint64 `json:"recursion_misses"`
}

// KernelFlows are the kernel side's counts of the flows it followed: every
// query first seen starts one, its answer ends it. The rest are still in
// the flow table (Live), or ended unanswered: dropped at their server,
// replaced by a resend of the same query (same socket and DNS id), or
// swept once older than any answer can be. Only unanswered queries ever
// leave that way, except those the table's sweeper evicted early to make
// room (Evicted), and none got a flow if the table was full (Refused:
// those queries are untracked, never taken for losses).
type KernelFlows struct {
	Started    uint64 `json:"started"`
	Answered   uint64 `json:"answered"`
	Live       uint64 `json:"live"`
	Unanswered uint64 `json:"ended_unanswered"`
	Swept      uint64 `json:"swept"`
	Evicted    uint64 `json:"evicted"`
	Refused    uint64 `json:"refused"`
}

// NamespaceSummary is the reconciliation of one namespace.
type NamespaceSummary struct {
	NetNS      uint32               `json:"netns"`
	Path       string               `json:"path,omitempty"`
	Kernel     ctstats.Counters     `json:"kernel"`
	Attributed correlate.Attributed `json:"attributed"`
	Late       bool                 `json:"baseline_late,omitempty"`
	// ClashBeforeWatched: of the clash_resolve explained, the races the
	// kernel rescued before the netfilter program was linked here (the
	// namespace's DNS showed after dnsrace started): counted from the
	// kernel's counter, no query named (tracepoint tier, 6.4+).
	ClashBeforeWatched uint64 `json:"clash_resolve_before_watched,omitempty"`
	// Watched: the netfilter program was linked in it (tracepoint tier,
	// 6.4+), so merged clash losers there are seen.
	Watched bool `json:"netfilter_watched,omitempty"`
	// Released: nothing but dnsrace held the namespace any more, so dnsrace
	// let go of it; Kernel is as read just before.
	Released bool `json:"released,omitempty"`
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
// pending, detaches everything, and returns the reconciliation. Later calls
// return the same summary.
func (s *Session) Stop() *Summary {
	s.stopOnce.Do(func() {
		// Let events already in the kernel's ring reach the reader.
		time.Sleep(50 * time.Millisecond)
		s.cancel()
		<-s.done
		// The reader is gone: its state is Stop's now; the writer's once
		// it has written the rest.
		now := monoNow()
		s.corr.Close(now)
		if s.warm != nil {
			close(s.warm)
		}
		s.handOver(now, false)
		close(s.outq)
		<-s.wdone
		if s.text != nil {
			s.text.Close(s.wall(now))
		}
		_ = s.buf.Flush()
		sum := s.reconcile("summary", s.snap.Load(), s.tracer.Lost())
		st := s.tracer.Stats()
		kf := &KernelFlows{Started: st.FlowsNew, Answered: st.FlowsAnswered, Live: s.tracer.FlowsLive(),
			Swept: st.FlowsSwept, Evicted: st.FlowsEvicted, Refused: st.FlowsRefused}
		if n := kf.Started - kf.Answered; n > kf.Live {
			kf.Unanswered = n - kf.Live
		}
		sum.KernelFlows = kf
		s.lostAtStop.Store(sum.EventsLost)
		s.missedAtStop.Store(&sum.RecursionMisses)
		s.closed.Store(true)
		s.ns.close()
		_ = s.tracer.Close()
		if s.readErr != nil && !errors.Is(s.readErr, context.Canceled) {
			sum.Mismatch = append(sum.Mismatch, "reading events: "+s.readErr.Error())
		}
		s.summary = sum
	})
	return s.summary
}

// Checkpoint hands write the reconciliation so far (type "checkpoint") and
// waits for it to return; it returns false, without calling write, once
// Stop has written the rest. write runs on the writer between two ticks'
// output, so what it writes to the session's output never lands inside an
// incident (an incident can straddle two flushes of the buffer), and the
// checkpoint counts exactly the incidents written before it. Drops younger
// than the correlator's classify delay (a quarter second) are not
// attributed yet and may show as a passing mismatch.
func (s *Session) Checkpoint(write func(*Summary)) bool {
	done := make(chan struct{})
	cp := func() {
		defer close(done)
		write(s.reconcile("checkpoint", s.snap.Load(), s.lost()))
	}
	select {
	case s.cpq <- cp:
		<-done
		return true
	case <-s.wdone:
		return false
	}
}

// reconcile builds the summary from a snapshot of what was attributed and
// the kernel's counter deltas of every namespace where DNS flows were
// tracked.
func (s *Session) reconcile(typ string, sn *snapshot, lost uint64) *Summary {
	sum := &Summary{
		Type: typ, DurationS: time.Since(s.started).Seconds(), Incidents: map[string]int{},
		Events: sn.events, EventBytes: s.tracer.Bytes(), EventsLost: lost, Malformed: s.tracer.Malformed(),
		Queries: sn.stats, Probes: ProbeSummaries(s.tracer.Probes()), Mismatch: []string{},
	}
	sum.RecursionMisses = map[string]uint64{}
	missed, err := s.tracer.Missed()
	if err != nil {
		sum.Mismatch = append(sum.Mismatch, err.Error())
	}
	for name, n := range missed {
		if n > 0 {
			sum.RecursionMisses[name] = n
		}
	}
	sum.RefusedAtSend = map[string]int{}
	for _, c := range correlate.Causes {
		sum.Incidents[c] = sn.counts[c]
		if n := sn.refused[c]; n > 0 {
			sum.RefusedAtSend[c] = n
		}
	}
	nss := map[uint32]bool{}
	for _, ns := range sn.ctNS {
		nss[ns] = true
	}
	for ns := range sn.attributed {
		nss[ns] = true
	}
	sum.NetfilterErrors = sn.watchErrs
	watched := map[uint32]bool{}
	for _, ns := range s.tracer.Watched() {
		watched[ns] = true
	}
	ids := make([]uint32, 0, len(nss))
	for ns := range nss {
		ids = append(ids, ns)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, ns := range ids {
		k, _ := s.ns.Delta(ns)
		a := sn.attributed[ns]
		before := sn.unwatched[ns]
		a.ClashResolve += before
		sum.ClashBeforeWatched += before
		sum.Namespaces = append(sum.Namespaces, NamespaceSummary{NetNS: ns, Path: s.ns.path(ns), Kernel: k, Attributed: a,
			Late: s.ns.isLate(ns), Watched: watched[ns], ClashBeforeWatched: before})
		sum.Kernel.Add(k)
		sum.Attributed.Add(a)
	}
	for _, ns := range sn.released {
		sum.Namespaces = append(sum.Namespaces, ns)
		sum.Kernel.Add(ns.Kernel)
		sum.Attributed.Add(ns.Attributed)
		sum.ClashBeforeWatched += ns.ClashBeforeWatched
	}
	if sn.earlier.Namespaces > 0 {
		e := sn.earlier
		sum.ReleasedEarlier = &e
		sum.Kernel.Add(e.Kernel)
		sum.Attributed.Add(e.Attributed)
		sum.ClashBeforeWatched += e.ClashBeforeWatched
	}
	sum.NamespacesReleased = sn.nReleased
	sum.NamespacesHeld = s.ns.held(watched)
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
