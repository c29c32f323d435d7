package probe

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// tickSample is how long TickRate watches jiffies advance: ±1 tick of
// error is ±10% at HZ=100, enough to snap to the right rate.
const tickSample = 100 * time.Millisecond

// tickRate is TickRate measured once per process: HZ is fixed at build.
var tickRate = sync.OnceValues(TickRate)

// commonRates are the HZ choices of x86 and arm64 kernels.
var commonRates = []float64{100, 250, 300, 1000}

// TickRate measures the running kernel's HZ, the rate jiffies advance,
// which the programs time their windows in (a jiffies read is a load where
// a nanosecond clock read is a clock-source read; see bpf/lib/config.h).
// It needs no kernel config file (a debug pod has the host's /boot at
// best under /host): a socket filter returning bpf_jiffies64 runs twice,
// tickSample apart, against CLOCK_MONOTONIC. A rate within 10% of a
// common one is that one. It blocks for tickSample.
func TickRate() (uint32, error) {
	j, err := newJiffies()
	if err != nil {
		return 0, err
	}
	defer j.Close()
	j0, t0, err := j.read()
	if err != nil {
		return 0, err
	}
	time.Sleep(tickSample)
	j1, t1, err := j.read()
	if err != nil {
		return 0, err
	}
	return snapRate(float64(j1-j0) / t1.Sub(t0).Seconds())
}

// jiffies reads the kernel's jiffies from user space: a socket filter
// that returns bpf_jiffies64, run on demand (its low 32 bits: what a
// difference of less than 49 days needs).
type jiffies struct{ prog *ebpf.Program }

func newJiffies() (*jiffies, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    "dnsrace_jiffies",
		Type:    ebpf.SocketFilter,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.FnJiffies64.Call(),
			asm.Return(),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("loading a program that reads jiffies (bpf_jiffies64, Linux 5.5+): %w", err)
	}
	return &jiffies{prog: prog}, nil
}

// packet is an Ethernet header's worth: the least a test run takes.
var packet = make([]byte, 14)

func (j *jiffies) read() (uint32, time.Time, error) {
	ret, err := j.prog.Run(&ebpf.RunOptions{Data: packet})
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("running a program that reads jiffies: %w", err)
	}
	return ret, time.Now(), nil
}

func (j *jiffies) Close() error { return j.prog.Close() }

// snapRate is measured as a whole rate: the nearest common rate if one is
// within 10%, else measured rounded.
func snapRate(measured float64) (uint32, error) {
	if measured < 10 || measured > 10000 || math.IsNaN(measured) {
		return 0, fmt.Errorf("jiffies advanced at %.1f a second: not a kernel tick rate", measured)
	}
	for _, r := range commonRates {
		if math.Abs(measured-r) <= r/10 {
			return uint32(r), nil
		}
	}
	return uint32(math.Round(measured)), nil
}
