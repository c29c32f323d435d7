package overhead

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"runtime"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dnsrace/dnsrace/internal/kconfig"
	"github.com/dnsrace/dnsrace/internal/lab"
	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// Addresses the harness adds to the lab. SinkAddr is an extra address of
// the dns namespace: the DNS flood's responder binds it, because the lab's
// own servers (which the VIP is DNATed to) answer far fewer queries per
// second than the flood sends. Non-DNS floods go to backend 0's address on
// SinkPort: the node forwards them without NAT (its DNAT only matches udp
// dport 53 to the VIP).
var (
	SinkAddr = netip.MustParseAddr("10.96.100.50")
	loopback = netip.MustParseAddr("127.0.0.1")
)

// DefaultPrefix names the harness's lab. It does not start with
// "dnsrace-": lab.Teardown("dnsrace") (dnsrace lab down, and tests using the
// default lab) removes every namespace named "dnsrace-*", which would pull
// the bench's lab away mid-run.
const DefaultPrefix = "dnsperf"

// SinkPort is the port of the non-DNS floods.
const SinkPort = 9999

// Config sets one harness run.
type Config struct {
	// Exe is a dnsrace binary (its `trace` subcommand is the tracer).
	Exe string
	// Prefix of the lab's namespaces (default DefaultPrefix).
	Prefix string
	// Duration of each flood (default 5s).
	Duration time.Duration
	// Rounds of (untraced, traced) pairs per case, alternating which goes
	// first (default 3).
	Rounds int
	// Sockets per flood (default 2).
	Sockets int
	// Rates is the capacity ladder in DNS queries per second; the search
	// stops after the first rate that loses events.
	Rates []int
	// Cases limits the per-packet cost cases by name (empty: all).
	Cases []string
	// SkipCost and SkipCapacity leave a part out.
	SkipCost, SkipCapacity bool
	// RingBufferSize for the tracer (0: its default).
	RingBufferSize uint32
	// Attach is the tracer's --attach (default tracepoint, the tier every
	// kernel has).
	Attach string
	// TracerArgs are more arguments for the tracer.
	TracerArgs []string
	// CountDuration is the length of each case's flood or loop in the
	// count pass (default 2s): one tracer for every case, the kernel's BPF
	// run-time statistics on for that pass only (never while timing), each
	// program's run_cnt read before and after each case.
	CountDuration time.Duration
	// CountOnly runs the count pass alone: no timed rounds, no capacity.
	// Counts hold under emulation, where timings do not.
	CountOnly bool
	// SkipCount leaves the count pass out.
	SkipCount bool
	// Floor adds a third kind of round to each cost case: the tracer with
	// every program emptied ("return 0", trace --empty-programs), attached
	// at the same hooks. Its ratio is what the hooks alone cost this
	// kernel, a floor no program at those hooks can go below.
	Floor bool
	// Log receives progress lines (nil: discarded).
	Log io.Writer
}

// DefaultRates is the capacity ladder when Config.Rates is empty.
var DefaultRates = []int{2000, 10000, 25000, 50000, 100000, 150000, 200000, 300000}

func (c *Config) defaults() {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Duration == 0 {
		c.Duration = 5 * time.Second
	}
	if c.Rounds == 0 {
		c.Rounds = 3
	}
	if c.Sockets == 0 {
		c.Sockets = 2
	}
	if len(c.Rates) == 0 {
		c.Rates = DefaultRates
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.Attach == "" {
		c.Attach = "tracepoint"
	}
	if c.CountDuration == 0 {
		c.CountDuration = 2 * time.Second
	}
}

// Case is one cost measurement: an unpaced flood along one path, counted
// at its sink, or (Syscall) a loop of system calls that send nothing.
type Case struct {
	Name string
	// Forward: pod0 -> node (bridge, routing, conntrack) -> dns ns.
	// Otherwise loopback inside pod1.
	Forward bool
	DNS     bool
	// Syscall names a loop of syscallLoops instead of a flood.
	Syscall string
	// Target is the lowest traced/untraced ratio the case should keep.
	Target float64
}

// Cases are the cost cases, in the order they run.
var Cases = []Case{
	{Name: "udp-forward", Forward: true, Target: 0.95},
	{Name: "udp-loopback", Target: 0.95},
	{Name: "dns-forward", Forward: true, DNS: true, Target: 0.80},
	{Name: "dns-loopback", DNS: true, Target: 0.80},
	{Name: "syscall-fork", Syscall: "fork", Target: 0.99},
	{Name: "syscall-open", Syscall: "open", Target: 0.97},
	{Name: "syscall-mmap", Syscall: "mmap", Target: 0.99},
}

// path is the case's path: forward, loopback or syscall.
func (c Case) path() string {
	switch {
	case c.Syscall != "":
		return "syscall"
	case c.Forward:
		return "forward"
	}
	return "loopback"
}

// CaseResult is the outcome of one Case.
type CaseResult struct {
	Name   string `json:"name"`
	Path   string `json:"path"`
	DNS    bool   `json:"dns"`
	Rounds int    `json:"rounds"`
	// Packets per second counted at the sink, per round.
	UntracedPPS []float64 `json:"untraced_pps"`
	TracedPPS   []float64 `json:"traced_pps"`
	// With Config.Floor: the rounds with empty programs at the tracer's
	// hooks, their rate and its ratio to untraced.
	HooksOnlyPPS   []float64 `json:"hooks_only_pps,omitempty"`
	HooksOnly      float64   `json:"hooks_only,omitempty"`
	HooksOnlyRatio float64   `json:"hooks_only_ratio,omitempty"`
	// Totals over all rounds (packets / seconds).
	Untraced float64 `json:"untraced"`
	Traced   float64 `json:"traced"`
	Ratio    float64 `json:"ratio"`
	// RatioRange: the lowest and highest traced/untraced of one round
	// (each traced round against the untraced round of its number), with
	// two rounds or more and a ratio: how far the machine's noise moves
	// the ratio, so two runs are compared against it.
	RatioRange []float64 `json:"ratio_range,omitempty"`
	Target     float64   `json:"target"`
	// The tracer while traced: CPU in cores, records, record bytes, records
	// lost, hook calls the kernel skipped its programs for (recursion
	// misses: a program already running on that CPU, as when a softirq
	// frees memory inside tp_kmem_cache_free; shown, as nearly all of them
	// would have sent nothing). A case whose traced rounds lost records has
	// no ratio (Invalid): a tracer that sheds work is not measured.
	TracerCPU  float64 `json:"tracer_cpu_cores"`
	Events     uint64  `json:"events"`
	EventBytes uint64  `json:"event_bytes"`
	EventsLost uint64  `json:"events_lost"`
	Skipped    uint64  `json:"hook_calls_skipped"`
	Invalid    bool    `json:"invalid"`
	// DNS cases: what the kernel side sent per answered query.
	Answered uint64 `json:"queries_answered,omitempty"`
	// DNS cases: answers the flood read that the tracer's kernel side did
	// not follow to their query (no flow: no answer record). Past 1% of
	// them the case is Invalid too: programs that lose track of queries do
	// less work than ones that follow them.
	Unfollowed uint64 `json:"answers_unfollowed,omitempty"`
	// AfterEviction: answers the kernel side followed whose queries the
	// correlator had already forgotten, the oldest past its cap of queries
	// in flight (the tracer counts them as evicted). Each was read and
	// looked up like any other: the round did the work it measures, but a
	// trace under such a flood would not report those queries' fate.
	AfterEviction   uint64  `json:"answers_after_eviction,omitempty"`
	RecordsPerQuery float64 `json:"records_per_answered_query,omitempty"`
	BytesPerQuery   float64 `json:"bytes_per_answered_query,omitempty"`
	// The count pass: every program's runs over the case's units.
	Runs *Runs `json:"runs,omitempty"`
	// The whole machine's busy CPU time (every process, the kernel's
	// softirqs, the tracer) per packet, query or loop counted, untraced and
	// traced: what tracing adds to a unit in microseconds, against the
	// budget the target's ratio allows. Not set for an invalid case.
	UntracedCPUUs float64 `json:"machine_cpu_us_per_unit_untraced,omitempty"`
	TracedCPUUs   float64 `json:"machine_cpu_us_per_unit_traced,omitempty"`
	// With Config.Floor: the same for the hooks-only rounds.
	HooksOnlyCPUUs float64 `json:"machine_cpu_us_per_unit_hooks_only,omitempty"`
}

// Step is one rate of the capacity search: paced DNS queries from pod0
// through the node to the responder, answered, with the tracer attached.
type Step struct {
	Rate      int     `json:"rate"`
	Seconds   float64 `json:"seconds"`
	Sent      float64 `json:"sent_per_s"`
	Received  float64 `json:"received_per_s"`
	Answers   float64 `json:"answers_per_s"`
	Events    uint64  `json:"events"`
	Bytes     uint64  `json:"event_bytes"`
	EventsPS  float64 `json:"events_per_s"`
	Lost      uint64  `json:"events_lost"`
	Skipped   uint64  `json:"hook_calls_skipped"`
	Queries   uint64  `json:"queries_traced"`
	Answered  uint64  `json:"queries_answered"`
	Incidents int     `json:"incidents"`
	TracerCPU float64 `json:"tracer_cpu_cores"`
	RSS       uint64  `json:"tracer_rss_bytes"`
	PeakRSS   uint64  `json:"tracer_peak_rss_bytes"`
	// Reached is false when the generator could not send the rate (the
	// machine ran out of CPU before the tracer lost anything).
	Reached bool `json:"reached"`
}

// Result is a whole run.
type Result struct {
	Kernel   string       `json:"kernel"`
	CPUs     int          `json:"cpus"`
	Tier     string       `json:"tier"`
	Duration float64      `json:"duration_s"`
	Cases    []CaseResult `json:"cases"`
	Capacity []Step       `json:"capacity"`
	// MaxZeroLoss is the highest rate of the ladder traced with no lost
	// event (0: none).
	MaxZeroLoss int `json:"max_zero_loss_rate"`
}

// Run builds the lab, measures, and tears the lab down.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg.defaults()
	if cfg.Exe == "" {
		return nil, errors.New("perf: Config.Exe (a dnsrace binary) is required")
	}
	res := &Result{Kernel: kconfig.Release(), CPUs: runtime.NumCPU(), Tier: cfg.Attach, Duration: cfg.Duration.Seconds()}
	topo := lab.Topology{Prefix: cfg.Prefix, Pods: 2, Backends: 2}
	_ = lab.Teardown(cfg.Prefix) // a crashed earlier run
	l, err := lab.Up(topo, lab.ServerConfig{})
	if err != nil {
		return nil, fmt.Errorf("building the lab: %w", err)
	}
	defer l.Down()
	if err := addSinkAddr(topo.DNSNS()); err != nil {
		return nil, err
	}
	h := &harness{cfg: cfg, topo: topo}
	var cases []Case
	for _, c := range Cases {
		if len(cfg.Cases) == 0 || contains(cfg.Cases, c.Name) {
			cases = append(cases, c)
		}
	}
	if cfg.CountOnly {
		cfg.SkipCost, cfg.SkipCapacity, cfg.SkipCount = true, true, false
		for _, c := range cases {
			res.Cases = append(res.Cases, CaseResult{Name: c.Name, Path: c.path(), DNS: c.DNS})
		}
	}
	if !cfg.SkipCost {
		for _, c := range cases {
			r, err := h.cost(ctx, c)
			if err != nil {
				return res, fmt.Errorf("case %s: %w", c.Name, err)
			}
			res.Cases = append(res.Cases, r)
		}
	}
	if !cfg.SkipCount && len(res.Cases) > 0 {
		runs, err := h.count(ctx, cases)
		if err != nil {
			return res, fmt.Errorf("count pass: %w", err)
		}
		for i := range res.Cases {
			res.Cases[i].Runs = runs[i]
		}
	}
	if !cfg.SkipCapacity {
		for _, rate := range cfg.Rates {
			s, err := h.step(ctx, rate)
			if err != nil {
				return res, fmt.Errorf("capacity at %d/s: %w", rate, err)
			}
			res.Capacity = append(res.Capacity, s)
			if s.Lost > 0 {
				break
			}
			if s.Reached {
				res.MaxZeroLoss = rate
			}
		}
	}
	return res, ctx.Err()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// addSinkAddr gives the dns namespace's eth0 SinkAddr.
func addSinkAddr(ns string) error {
	return nsutil.Do(ns, func() error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("dns namespace eth0: %w", err)
		}
		a := &netlink.Addr{IPNet: netlink.NewIPNet(SinkAddr.AsSlice())}
		a.IPNet.Mask = []byte{255, 255, 255, 0}
		if err := netlink.AddrAdd(link, a); err != nil {
			return fmt.Errorf("adding %s to the dns namespace: %w", SinkAddr, err)
		}
		return nil
	})
}

type harness struct {
	cfg  Config
	topo lab.Topology
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.cfg.Log, format+"\n", args...)
}

func (h *harness) tracerArgs() []string {
	a := []string{"--attach", h.cfg.Attach}
	if h.cfg.RingBufferSize > 0 {
		a = append(a, fmt.Sprintf("--ring-buffer-size=%d", h.cfg.RingBufferSize))
	}
	return append(a, h.cfg.TracerArgs...)
}

// sinkFor starts the sink of a case and returns it with the flood that
// feeds it.
func (h *harness) sinkFor(c Case) (*Sink, FloodConfig, error) {
	fc := FloodConfig{Sockets: h.cfg.Sockets, Duration: h.cfg.Duration, DNS: c.DNS, ReadAnswers: c.DNS}
	var ns string
	var at netip.AddrPort
	switch {
	case c.Forward && c.DNS:
		ns, at, fc.NS = h.topo.DNSNS(), netip.AddrPortFrom(SinkAddr, 53), h.topo.PodNS(0)
	case c.Forward:
		ns, at, fc.NS = h.topo.DNSNS(), netip.AddrPortFrom(lab.BackendAddr(0), SinkPort), h.topo.PodNS(0)
	case c.DNS:
		ns, at, fc.NS = h.topo.PodNS(1), netip.AddrPortFrom(loopback, 53), h.topo.PodNS(1)
	default:
		ns, at, fc.NS = h.topo.PodNS(1), netip.AddrPortFrom(loopback, SinkPort), h.topo.PodNS(1)
	}
	fc.Dst = at
	s, err := StartSink(ns, at, c.DNS, 2)
	return s, fc, err
}

// measured is one flood's outcome at the sink, plus the tracer's view.
type measured struct {
	flood     FloodResult
	received  uint64
	secs      float64
	cpu       time.Duration
	cpuSecs   float64
	busy      time.Duration // the machine's, over the flood
	rss, hwm  uint64
	sum       *TraceSummary
	incidents int
}

// drive runs one flood against s (or, with s nil, the case's system call
// loop) for fc.Duration and fills m's flood, received and secs.
func (h *harness) drive(ctx context.Context, c Case, s *Sink, fc FloodConfig, m *measured) error {
	if c.Syscall != "" {
		n, err := syscallLoop(ctx, c.Syscall, fc.Duration)
		if err != nil {
			return err
		}
		m.received, m.secs = n, fc.Duration.Seconds()
		return nil
	}
	r0 := s.Received()
	fr, err := Flood(ctx, fc)
	if err != nil {
		return err
	}
	if !fc.ReadAnswers {
		time.Sleep(100 * time.Millisecond) // in-flight packets reach the sink
	}
	m.flood, m.received, m.secs = fr, s.Received()-r0, fc.Duration.Seconds()
	return nil
}

// roundKind is what runs beside one flood.
type roundKind int

const (
	untraced  roundKind = iota
	traced              // the tracer
	hooksOnly           // the tracer with every program emptied
)

func (k roundKind) String() string {
	return [...]string{"untraced", "traced", "hooks"}[k]
}

// once runs one flood against s (or, with s nil, the case's system call
// loop), under a fresh tracer unless untraced.
func (h *harness) once(ctx context.Context, c Case, s *Sink, fc FloodConfig, kind roundKind) (measured, error) {
	var m measured
	var tp *tracerProc
	if kind != untraced {
		args := h.tracerArgs()
		if kind == hooksOnly {
			args = append(args, "--empty-programs")
		}
		var err error
		if tp, err = startTracer(h.cfg.Exe, fc.Duration+2*time.Minute, args); err != nil {
			return m, err
		}
		defer func() {
			if tp != nil {
				tp.kill()
			}
		}()
	}
	time.Sleep(200 * time.Millisecond) // settle
	var cpu0 time.Duration
	if tp != nil {
		cpu0, _ = procCPU(tp.pid())
	}
	busy0, err := machineBusy()
	if err != nil {
		return m, err
	}
	t0 := time.Now()
	if err := h.drive(ctx, c, s, fc, &m); err != nil {
		return m, err
	}
	busy1, err := machineBusy()
	if err != nil {
		return m, err
	}
	m.busy = busy1 - busy0
	if tp != nil {
		cpu1, _ := procCPU(tp.pid())
		m.cpu, m.cpuSecs = cpu1-cpu0, time.Since(t0).Seconds()
		m.rss, m.hwm, _ = procMem(tp.pid())
		sum, inc, err := tp.stop()
		tp = nil
		if err != nil {
			return m, err
		}
		m.sum, m.incidents = sum, inc
	}
	return m, nil
}

func (h *harness) cost(ctx context.Context, c Case) (CaseResult, error) {
	r := CaseResult{Name: c.Name, Path: c.path(), DNS: c.DNS, Rounds: h.cfg.Rounds, Target: c.Target}
	var s *Sink
	var fc FloodConfig
	if c.Syscall == "" {
		var err error
		if s, fc, err = h.sinkFor(c); err != nil {
			return r, err
		}
		defer s.Close()
	} else {
		fc.Duration = h.cfg.Duration
	}
	// Per kind of round: each round's rate, and the units and seconds of
	// all its rounds.
	perRound := [...]*[]float64{untraced: &r.UntracedPPS, traced: &r.TracedPPS, hooksOnly: &r.HooksOnlyPPS}
	var units, secs, busy [len(perRound)]float64
	var cpu, cpuS float64
	var answers uint64 // read by the floods of the traced rounds
	for round := range h.cfg.Rounds {
		for _, kind := range roundOrder(round, h.cfg.Floor) {
			var unfollowed, afterEviction uint64 // a traced DNS round's
			m, err := h.once(ctx, c, s, fc, kind)
			if err != nil {
				return r, err
			}
			pps := float64(m.received) / m.secs
			*perRound[kind] = append(*perRound[kind], pps)
			units[kind] += float64(m.received)
			secs[kind] += m.secs
			busy[kind] += m.busy.Seconds()
			switch kind {
			case hooksOnly:
				r.EventsLost += m.sum.EventsLost // none: nothing is sent
			case traced:
				cpu += m.cpu.Seconds()
				cpuS += m.cpuSecs
				r.Events += m.sum.Events
				r.EventBytes += m.sum.EventBytes
				r.EventsLost += m.sum.EventsLost
				r.Skipped += m.sum.Skipped()
				r.Answered += m.sum.Queries.Answered
				if c.DNS {
					unfollowed, afterEviction = unfollowedAnswers(m.flood.Answers, m.sum)
					r.Unfollowed += unfollowed
					r.AfterEviction += afterEviction
				}
				answers += m.flood.Answers
			}
			h.logf("  %-13s round %d %-8s %10.0f /s (sent %d)", c.Name, round+1, kind, pps, m.flood.Sent)
			if unfollowed+afterEviction > 0 {
				q, k := m.sum.Queries, m.sum.KernelFlows
				h.logf("  %-13s round %d: the flood read %d answers, the tracer followed %d of %d queries (%d in flight, %d evicted); kernel flows: %d started, %d answered, %d live, %d ended unanswered",
					c.Name, round+1, m.flood.Answers, q.Answered, q.Queries, q.InFlight, q.Evicted, k.Started, k.Answered, k.Live, k.Unanswered)
			}
		}
	}
	r.Untraced, r.Traced = units[untraced]/secs[untraced], units[traced]/secs[traced]
	r.Invalid = r.EventsLost > 0 || r.Unfollowed*100 > answers
	if r.Untraced > 0 && !r.Invalid {
		r.Ratio = r.Traced / r.Untraced
		r.RatioRange = roundRatios(r.UntracedPPS, r.TracedPPS)
		if units[untraced] > 0 && units[traced] > 0 {
			r.UntracedCPUUs = busy[untraced] / units[untraced] * 1e6
			r.TracedCPUUs = busy[traced] / units[traced] * 1e6
		}
		if units[hooksOnly] > 0 {
			r.HooksOnlyCPUUs = busy[hooksOnly] / units[hooksOnly] * 1e6
		}
	}
	if secs[hooksOnly] > 0 && r.Untraced > 0 {
		r.HooksOnly = units[hooksOnly] / secs[hooksOnly]
		r.HooksOnlyRatio = r.HooksOnly / r.Untraced
	}
	if cpuS > 0 {
		r.TracerCPU = cpu / cpuS
	}
	if r.Answered > 0 {
		r.RecordsPerQuery = float64(r.Events) / float64(r.Answered)
		r.BytesPerQuery = float64(r.EventBytes) / float64(r.Answered)
	}
	return r, nil
}

// roundOrder is the order of one round's floods: alternating which goes
// first (untraced, traced; then traced, untraced), and with the floor
// rotating three kinds, so slow drift falls on each kind alike.
func roundOrder(round int, floor bool) []roundKind {
	if !floor {
		if round%2 == 1 {
			return []roundKind{traced, untraced}
		}
		return []roundKind{untraced, traced}
	}
	kinds := []roundKind{untraced, hooksOnly, traced}
	i := round % len(kinds)
	return append(kinds[i:], kinds[:i]...)
}

func (h *harness) step(ctx context.Context, rate int) (Step, error) {
	st := Step{Rate: rate}
	c := Case{Name: "capacity", Forward: true, DNS: true}
	s, fc, err := h.sinkFor(c)
	if err != nil {
		return st, err
	}
	defer s.Close()
	fc.Rate = rate
	fc.Sockets = max(h.cfg.Sockets, 4)
	m, err := h.once(ctx, c, s, fc, traced)
	if err != nil {
		return st, err
	}
	st.Seconds = m.secs
	st.Sent = float64(m.flood.Sent) / m.secs
	st.Received = float64(m.received) / m.secs
	st.Answers = float64(m.flood.Answers) / m.secs
	st.Events, st.Bytes, st.Lost, st.Skipped = m.sum.Events, m.sum.EventBytes, m.sum.EventsLost, m.sum.Skipped()
	st.EventsPS = float64(m.sum.Events) / m.secs
	st.Queries, st.Answered = m.sum.Queries.Queries, m.sum.Queries.Answered
	st.Incidents = m.incidents
	st.TracerCPU = m.cpu.Seconds() / m.cpuSecs
	st.RSS, st.PeakRSS = m.rss, m.hwm
	st.Reached = st.Sent >= 0.95*float64(rate)
	h.logf("  capacity %7d/s: sent %.0f/s, received %.0f/s, answers %.0f/s, events %d (%.0f/s), lost %d, tracer %.2f cores, RSS %.1f MB",
		rate, st.Sent, st.Received, st.Answers, st.Events, st.EventsPS, st.Lost, st.TracerCPU, float64(st.RSS)/1e6)
	return st, nil
}

// roundRatios is the lowest and highest traced/untraced of rounds with the
// same number, nil with fewer than two such pairs.
func roundRatios(untraced, traced []float64) []float64 {
	var lo, hi float64
	n := 0
	for i := range min(len(untraced), len(traced)) {
		if untraced[i] <= 0 {
			continue
		}
		x := traced[i] / untraced[i]
		if n == 0 || x < lo {
			lo = x
		}
		if n == 0 || x > hi {
			hi = x
		}
		n++
	}
	if n < 2 {
		return nil
	}
	return []float64{lo, hi}
}

// WriteText prints a result as tables.
func WriteText(w io.Writer, r *Result) {
	fmt.Fprintf(w, "kernel %s, %d CPUs, %s tier, %.0fs per round\n\n", r.Kernel, r.CPUs, r.Tier, r.Duration)
	if len(r.Cases) > 0 {
		fmt.Fprintf(w, "%-13s %12s %12s %-9s %-13s %11s %10s %9s %8s\n", "case", "untraced/s", "traced/s", "ratio", "target", "tracer CPU", "records", "lost", "B/query")
		for _, c := range r.Cases {
			ratio, mark := fmt.Sprintf("%.3f", c.Ratio), "ok"
			switch {
			case c.Invalid && c.EventsLost == 0:
				ratio, mark = "invalid", "unmatched"
			case c.Invalid:
				ratio, mark = "invalid", "lost"
			case c.Ratio < c.Target:
				mark = "missed"
			}
			perQ := "-"
			if c.BytesPerQuery > 0 {
				perQ = fmt.Sprintf("%.0f", c.BytesPerQuery)
			}
			fmt.Fprintf(w, "%-13s %12.0f %12.0f %-9s >=%.2f %-6s %8.2f c %10d %9d %8s\n",
				c.Name, c.Untraced, c.Traced, ratio, c.Target, mark, c.TracerCPU, c.Events, c.EventsLost, perQ)
		}
		fmt.Fprintln(w, "(a case whose traced rounds lost records, or whose answers the tracer did not follow to their queries, has no ratio: the tracer shed work)")
		for _, c := range r.Cases {
			if len(c.RatioRange) == 2 {
				fmt.Fprintf(w, "%-13s round by round %.3f to %.3f (%d rounds): a difference within that is noise\n", c.Name, c.RatioRange[0], c.RatioRange[1], c.Rounds)
			}
		}
		for _, c := range r.Cases {
			if c.Unfollowed > 0 {
				fmt.Fprintf(w, "%-13s %d answers the flood read were not followed to their query by the tracer\n", c.Name, c.Unfollowed)
			}
			if c.AfterEviction > 0 {
				fmt.Fprintf(w, "%-13s %d answers came after the correlator had evicted their queries (the oldest past its cap in flight)\n", c.Name, c.AfterEviction)
			}
		}
		for _, c := range r.Cases {
			if c.HooksOnly > 0 {
				fmt.Fprintf(w, "%-13s hooks only (every program emptied, same hooks): %.0f/s, %.3f of untraced", c.Name, c.HooksOnly, c.HooksOnlyRatio)
				if c.Ratio > 0 {
					fmt.Fprintf(w, "; traced is %.3f of hooks only", c.Traced/c.HooksOnly)
				}
				fmt.Fprintln(w)
			}
		}
		for _, c := range r.Cases {
			if l := cpuPerUnitLine(c); l != "" {
				fmt.Fprintf(w, "%-13s %s\n", c.Name, l)
			}
			if l := costSplitLine(c); l != "" {
				fmt.Fprintf(w, "%-13s %s\n", "", l)
			}
		}
		for _, c := range r.Cases {
			if c.Skipped > 0 {
				fmt.Fprintf(w, "%-13s the kernel skipped %d hook calls of the tracer (recursion misses)\n", c.Name, c.Skipped)
			}
		}
		fmt.Fprintln(w)
	}
	writeRuns(w, r)
	if len(r.Capacity) > 0 {
		fmt.Fprintf(w, "%9s %10s %10s %10s %10s %8s %9s %9s %8s\n", "rate", "sent/s", "recv/s", "answers/s", "records/s", "lost", "queries", "CPU", "RSS MB")
		for _, s := range r.Capacity {
			fmt.Fprintf(w, "%9d %10.0f %10.0f %10.0f %10.0f %8d %9d %7.2f c %8.1f\n",
				s.Rate, s.Sent, s.Received, s.Answers, s.EventsPS, s.Lost, s.Queries, s.TracerCPU, float64(s.RSS)/1e6)
		}
		fmt.Fprintf(w, "highest rate traced with zero lost records: %d queries/s\n", r.MaxZeroLoss)
		for _, s := range r.Capacity {
			if s.Skipped > 0 {
				fmt.Fprintf(w, "%9d the kernel skipped %d hook calls of the tracer (recursion misses)\n", s.Rate, s.Skipped)
			}
		}
	}
}

// Problems lists what makes a smoke run fail: records lost (in any case or
// step), a flood's answers the tracer did not follow, or a tracer that saw
// fewer queries than the responder got.
func Problems(r *Result) []string {
	var p []string
	for _, c := range r.Cases {
		if c.EventsLost > 0 {
			p = append(p, fmt.Sprintf("case %s: %d records lost: its ratio is not a measurement", c.Name, c.EventsLost))
		} else if c.Invalid {
			p = append(p, fmt.Sprintf("case %s: %d answers the flood read were not followed to their query: its ratio is not a measurement", c.Name, c.Unfollowed))
		}
	}
	for _, s := range r.Capacity {
		if s.Lost > 0 {
			p = append(p, fmt.Sprintf("%d records lost at %d queries/s", s.Lost, s.Rate))
		}
		if float64(s.Queries) < s.Received*0.99*s.Seconds {
			p = append(p, fmt.Sprintf("at %d queries/s the tracer saw %d queries, the responder %.0f", s.Rate, s.Queries, s.Received*s.Seconds))
		}
	}
	return p
}

// cpuPerUnitLine says what tracing cost each unit of a case in the
// machine's CPU time, and how much the case's target leaves it: traced /
// untraced >= target holds while the traced cost per unit stays under
// untraced / target.
func cpuPerUnitLine(c CaseResult) string {
	if c.UntracedCPUUs <= 0 || c.TracedCPUUs <= 0 {
		return ""
	}
	u := unitOf(c)
	hooks := ""
	if c.HooksOnlyCPUUs > 0 {
		hooks = fmt.Sprintf(" (the hooks alone %.2f)", c.HooksOnlyCPUUs-c.UntracedCPUUs)
	}
	return fmt.Sprintf("machine CPU per %s: %.2f µs untraced, %.2f traced: tracing costs %.2f µs a %s%s, the target leaves %.2f",
		u, c.UntracedCPUUs, c.TracedCPUUs, c.TracedCPUUs-c.UntracedCPUUs, u, hooks, c.UntracedCPUUs*(1/c.Target-1))
}

// costSplitLine splits what tracing cost a unit into parts measured apart:
// the hooks' dispatch (the hooks-only rounds), the programs' own time
// (run_time_ns of the count pass, whose two clock reads a run it
// includes) and the reader (the tracer process's CPU over the traced
// rounds). What none of them accounts for is the rest, printed too, so a
// part nobody measured cannot hide. Empty without the hooks-only rounds or
// a valid count pass.
func costSplitLine(c CaseResult) string {
	if c.UntracedCPUUs <= 0 || c.TracedCPUUs <= 0 || c.HooksOnlyCPUUs <= 0 || c.Traced <= 0 ||
		c.Runs == nil || c.Runs.Invalid || c.Runs.Units <= 0 || c.Runs.PerUnit <= 0 {
		return ""
	}
	var ns uint64
	for _, p := range c.Runs.Programs {
		ns += p.RunTimeNs
	}
	hooks := c.HooksOnlyCPUUs - c.UntracedCPUUs
	progs := float64(ns) / c.Runs.Units / 1e3
	reader := c.TracerCPU / c.Traced * 1e6
	rest := c.TracedCPUUs - c.UntracedCPUUs - hooks - progs - reader
	return fmt.Sprintf("of it: hooks %.2f, programs' own time %.2f (%.2f runs, statistics' clock reads included), reader %.2f, rest %+.2f",
		hooks, progs, c.Runs.PerUnit, reader, rest)
}

// unfollowedAnswers splits the answers a flood read that the correlator
// did not see answered: those the kernel side did not follow either
// (unfollowed), and those it followed to queries the correlator had
// evicted. A tracer without kernel flow counts has only the first kind.
func unfollowedAnswers(read uint64, sum *TraceSummary) (unfollowed, afterEviction uint64) {
	followed := sum.Queries.Answered
	if read <= followed {
		return 0, 0
	}
	kernel := sum.KernelFlows.Answered
	if sum.KernelFlows.Started == 0 || kernel <= followed {
		return read - followed, 0
	}
	if read > kernel {
		unfollowed = read - kernel
	}
	return unfollowed, min(read, kernel) - followed
}
