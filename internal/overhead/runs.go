package overhead

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// Runs is what the count pass measured for one case: how often each of the
// tracer's programs ran (the kernel's run_cnt, BPF_ENABLE_STATS on for the
// pass only) per unit of the case, and for how long (run_time_ns). The
// counts hold on any machine and under emulation; the times hold for the
// machine they were read on only, and under emulation (qemu TCG) time the
// emulator, not any hardware.
type Runs struct {
	// Unit is what the case counts ("packet": sent by the flood; "query":
	// answered; "loop": a system call loop's iteration) and Units how many.
	Unit  string  `json:"unit"`
	Units float64 `json:"units"`
	// Sent: the flood's packets or queries sent (0 for a loop); Delivered:
	// those its sink took (packet floods).
	Sent      float64 `json:"sent,omitempty"`
	Delivered float64 `json:"delivered,omitempty"`
	// PerUnit is every program's runs together, per unit; NsPerUnit their
	// run time together, per unit: the kernel time the programs cost a
	// unit, the statistics' clock reads included.
	PerUnit   float64 `json:"runs_per_unit"`
	NsPerUnit float64 `json:"prog_ns_per_unit"`
	// Programs: each program's runs and time (run_time_ns, which includes
	// the accounting's own clock reads), busiest first.
	Programs []ProgStat `json:"programs"`
	// RecordsLost over the whole pass: a pass that lost records did not do
	// the work it counts, and has no figure (Invalid).
	RecordsLost uint64 `json:"records_lost"`
	Invalid     bool   `json:"invalid,omitempty"`
}

// Per returns program name's runs per unit (0 when it did not run).
func (r *Runs) Per(name string) float64 {
	if r == nil || r.Units <= 0 {
		return 0
	}
	for _, p := range r.Programs {
		if p.Name == name {
			return float64(p.Runs) / r.Units
		}
	}
	return 0
}

// count is the count pass: one tracer for every case, run-time statistics
// on, each case's flood or loop for CountDuration, run_cnt read around it.
func (h *harness) count(ctx context.Context, cases []Case) ([]*Runs, error) {
	tp, err := startTracer(h.cfg.Exe, time.Duration(len(cases))*(h.cfg.CountDuration+time.Minute), h.tracerArgs())
	if err != nil {
		return nil, err
	}
	defer func() {
		if tp != nil {
			tp.kill()
		}
	}()
	stats, err := enableProgStats()
	if err != nil {
		return nil, err
	}
	defer stats.Close()
	out := make([]*Runs, len(cases))
	for i, c := range cases {
		r, err := h.countCase(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("case %s: %w", c.Name, err)
		}
		out[i] = r
		h.logf("  %-13s count    %8.2f runs, %6.0f ns per %s over %.0f", c.Name, r.PerUnit, r.NsPerUnit, r.Unit, r.Units)
	}
	stopAt := time.Now()
	sum, incidents, err := tp.stop()
	causes := tp.causes
	tp = nil
	if err != nil {
		return nil, err
	}
	// A stop writes what is still open: a flood's lost queries, each an
	// incident.
	h.logf("  tracer stopped in %.1f s, %d incidents written %v", time.Since(stopAt).Seconds(), incidents, causes)
	for _, r := range out {
		r.RecordsLost = sum.EventsLost
		r.Invalid = sum.EventsLost > 0
	}
	return out, nil
}

func (h *harness) countCase(ctx context.Context, c Case) (*Runs, error) {
	var s *Sink
	fc := FloodConfig{Duration: h.cfg.CountDuration}
	if c.Syscall == "" {
		var err error
		if s, fc, err = h.sinkFor(c); err != nil {
			return nil, err
		}
		defer s.Close()
		fc.Duration = h.cfg.CountDuration
	}
	// The window opens once the previous case's packets are gone and
	// closes once this case's are: each case counts its own runs, all of
	// them.
	before, err := quietProgCounts()
	if err != nil {
		return nil, err
	}
	var m measured
	if err := h.drive(ctx, c, s, fc, &m); err != nil {
		return nil, err
	}
	after, err := quietProgCounts()
	if err != nil {
		return nil, err
	}
	r := &Runs{Programs: progDelta(before, after)}
	switch {
	case c.Syscall != "":
		r.Unit, r.Units = "loop", float64(m.received)
	case c.DNS:
		r.Unit, r.Units, r.Sent = "query", float64(m.flood.Answers), float64(m.flood.Sent)
	default:
		r.Unit, r.Units, r.Sent, r.Delivered = "packet", float64(m.flood.Sent), float64(m.flood.Sent), float64(m.received)
	}
	r.sum()
	return r, nil
}

// sum sets PerUnit and NsPerUnit from Programs and Units.
func (r *Runs) sum() {
	r.PerUnit, r.NsPerUnit = 0, 0
	if r.Units <= 0 {
		return
	}
	for _, p := range r.Programs {
		r.PerUnit += float64(p.Runs)
		r.NsPerUnit += float64(p.RunTimeNs)
	}
	r.PerUnit /= r.Units
	r.NsPerUnit /= r.Units
}

// writeRuns prints the count pass: per case, the runs and the programs'
// time per unit, then program by program its runs per unit at its time
// per run.
func writeRuns(w io.Writer, res *Result) {
	any := false
	for _, c := range res.Cases {
		if c.Runs != nil {
			any = true
		}
	}
	if !any {
		return
	}
	fmt.Fprintf(w, "BPF program runs and time per unit (%s tier; run_cnt and run_time_ns, run-time statistics on for this pass only):\n", res.Tier)
	for _, c := range res.Cases {
		fmt.Fprintf(w, "%-13s %s\n", c.Name, runsLine(c.Runs))
	}
	fmt.Fprintln(w, "(times include the statistics' two clock reads a run and hold for this machine only; under emulation, qemu TCG, they time the emulator, not any hardware)")
	fmt.Fprintln(w)
}

func runsLine(r *Runs) string {
	if r == nil {
		return "-"
	}
	if r.Invalid {
		return fmt.Sprintf("invalid: %d records lost during the pass", r.RecordsLost)
	}
	if r.Units <= 0 {
		return fmt.Sprintf("no %s counted", r.Unit)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%.2f runs, %.0f ns per %s", r.PerUnit, r.NsPerUnit, r.Unit)
	sep := ": "
	for _, p := range r.Programs {
		if float64(p.Runs)/r.Units < 0.005 {
			continue
		}
		fmt.Fprintf(&b, "%s%s %.2f at %.0f ns", sep, p.Name, float64(p.Runs)/r.Units, p.NsPerRun)
		sep = ", "
	}
	return b.String()
}

// quietProgCounts reads the programs' run counts once the packet programs
// have stopped running: a flood's packets still queued when its sender
// stops (a device's backlog, a responder's socket; slow to drain under
// emulation) belong to its own case, not to the next one's window. The
// slab-free program runs whatever the network does and is not waited
// for. Some machines never go silent, so "stopped" is a rise of at most
// quietRuns in quietGap, and the wait ends after quietMax whatever it reads.
func quietProgCounts() (progCounts, error) {
	const (
		quietGap  = 100 * time.Millisecond
		quietRuns = 4
		quietMax  = 3 * time.Second
	)
	prev, err := readProgCounts()
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(quietMax); time.Now().Before(deadline); {
		time.Sleep(quietGap)
		cur, err := readProgCounts()
		if err != nil {
			return nil, err
		}
		var rise uint64
		for _, p := range progDelta(prev, cur) {
			if !slabFreeProg(p.Name) {
				rise += p.Runs
			}
		}
		prev = cur
		if rise <= quietRuns {
			break
		}
	}
	return prev, nil
}

// slabFreeProg tells the tracepoint tier's kmem_cache_free programs (the
// tier before 6.4; one per attach variant): they run at every slab free on
// the machine, whatever the network does.
func slabFreeProg(name string) bool {
	return strings.HasPrefix(name, "tp_kmem_cache_free")
}
