package overhead

import (
	"io"
	"time"
)

// This file says what a harness run measures: its Config and the cost
// cases.

// DefaultPrefix names the harness's lab. It does not start with
// "dnsrace-": lab.Teardown("dnsrace") (dnsrace lab down, and tests using the
// default lab) removes every namespace named "dnsrace-*", which would pull
// the bench's lab away mid-run.
const DefaultPrefix = "dnsperf"

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
	// stops after the first rate that loses records.
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
