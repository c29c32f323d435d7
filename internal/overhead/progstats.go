package overhead

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/bpf"
)

// ProgStat is the kernel's account of one of the tracer's BPF programs
// over a measured flood (kernel.bpf_stats_enabled's run count and time,
// which include the accounting's own clock reads).
type ProgStat struct {
	Name      string  `json:"name"`
	Runs      uint64  `json:"runs"`
	RunTimeNs uint64  `json:"run_time_ns"`
	NsPerRun  float64 `json:"ns_per_run"`
	// Recursion counts runs the kernel skipped because a BPF program was
	// already running on that CPU (5.12+).
	Recursion uint64 `json:"recursion_misses,omitempty"`
}

// progCounts maps a program ID to its name and counters.
type progCounts map[ebpf.ProgramID]ProgStat

// ourProgNames is the set of names dnsrace's programs go by: their function
// names (which program info gives where the program has BTF) and those cut
// to the kernel's BPF_OBJ_NAME_LEN-1 bytes.
var ourProgNames = sync.OnceValues(func() (map[string]bool, error) {
	spec, err := bpf.LoadDnsrace()
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for name := range spec.Programs {
		names[name] = true
		if len(name) > unix.BPF_OBJ_NAME_LEN-1 {
			names[name[:unix.BPF_OBJ_NAME_LEN-1]] = true
		}
	}
	return names, nil
})

// enableProgStats turns the kernel's BPF run-time accounting on until the
// closer is closed (BPF_ENABLE_STATS: nothing is left on if the process
// dies).
func enableProgStats() (io.Closer, error) {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enabling BPF run-time statistics (Linux 5.8+): %w", err)
	}
	return c, nil
}

// readProgCounts reads the counters of every loaded program that carries
// one of dnsrace's names (the bench's tracer: run nothing else that loads
// them meanwhile).
func readProgCounts() (progCounts, error) {
	names, err := ourProgNames()
	if err != nil {
		return nil, err
	}
	out := progCounts{}
	var id ebpf.ProgramID
	for {
		id, err = ebpf.ProgramGetNextID(id)
		if errors.Is(err, unix.ENOENT) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded meanwhile
		}
		info, ierr := p.Info()
		st, serr := p.Stats()
		p.Close()
		if ierr != nil || serr != nil || !names[info.Name] {
			continue
		}
		out[id] = ProgStat{Name: info.Name, Runs: st.RunCount, RunTimeNs: uint64(st.Runtime), Recursion: st.RecursionMisses}
	}
}

// progDelta is what ran between two readings, by program name (a name
// with several variants loaded sums them), busiest first.
func progDelta(before, after progCounts) []ProgStat {
	var d []ProgStat
	for id, a := range after {
		b := before[id]
		d = append(d, ProgStat{Name: a.Name, Runs: a.Runs - b.Runs, RunTimeNs: a.RunTimeNs - b.RunTimeNs, Recursion: a.Recursion - b.Recursion})
	}
	return slices.DeleteFunc(addProgs(nil, d), func(s ProgStat) bool { return s.Runs == 0 && s.Recursion == 0 })
}

// addProgs sums b into a, by name, busiest first.
func addProgs(a, b []ProgStat) []ProgStat {
	for _, s := range b {
		i := slices.IndexFunc(a, func(x ProgStat) bool { return x.Name == s.Name })
		if i < 0 {
			a = append(a, ProgStat{Name: s.Name})
			i = len(a) - 1
		}
		a[i].Runs += s.Runs
		a[i].RunTimeNs += s.RunTimeNs
		a[i].Recursion += s.Recursion
		if a[i].Runs > 0 {
			a[i].NsPerRun = float64(a[i].RunTimeNs) / float64(a[i].Runs)
		}
	}
	sort.Slice(a, func(i, j int) bool { return a[i].RunTimeNs > a[j].RunTimeNs })
	return a
}

// unitOf names what a case counts.
func unitOf(c CaseResult) string {
	switch {
	case c.Path == "syscall":
		return "loop"
	case c.DNS:
		return "query"
	}
	return "packet"
}
