package overhead

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dnsrace/dnsrace/internal/kconfig"
	"github.com/dnsrace/dnsrace/internal/lab"
	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// This file runs the harness: the lab, the rounds of each cost case with
// and without the tracer, and the capacity search.

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

// SinkPort is the port of the non-DNS floods.
const SinkPort = 9999

// Run builds the lab, measures, and tears the lab down.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg.defaults()
	if cfg.Exe == "" {
		return nil, errors.New("starting the harness: Config.Exe (a dnsrace binary) is required")
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
		if len(cfg.Cases) == 0 || slices.Contains(cfg.Cases, c.Name) {
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

// addSinkAddr gives the dns namespace's eth0 SinkAddr.
func addSinkAddr(ns string) error {
	return nsutil.Do(ns, func() error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("finding eth0 of the dns namespace: %w", err)
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
				r.RecordsLost += m.sum.EventsLost // none: nothing is sent
			case traced:
				cpu += m.cpu.Seconds()
				cpuS += m.cpuSecs
				r.Records += m.sum.Events
				r.RecordBytes += m.sum.EventBytes
				r.RecordsLost += m.sum.EventsLost
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
	r.Invalid = r.RecordsLost > 0 || r.Unfollowed*100 > answers
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
		r.RecordsPerQuery = float64(r.Records) / float64(r.Answered)
		r.BytesPerQuery = float64(r.RecordBytes) / float64(r.Answered)
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
	st.Records, st.RecordBytes, st.Lost, st.Skipped = m.sum.Events, m.sum.EventBytes, m.sum.EventsLost, m.sum.Skipped()
	st.RecordsPS = float64(m.sum.Events) / m.secs
	st.Queries, st.Answered = m.sum.Queries.Queries, m.sum.Queries.Answered
	st.Incidents = m.incidents
	st.TracerCPU = m.cpu.Seconds() / m.cpuSecs
	st.RSS, st.PeakRSS = m.rss, m.hwm
	st.Reached = st.Sent >= 0.95*float64(rate)
	h.logf("  capacity %7d/s: sent %.0f/s, received %.0f/s, answers %.0f/s, records %d (%.0f/s), lost %d, tracer %.2f cores, RSS %.1f MB",
		rate, st.Sent, st.Received, st.Answers, st.Records, st.RecordsPS, st.Lost, st.TracerCPU, float64(st.RSS)/1e6)
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
