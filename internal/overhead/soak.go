package overhead

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dnsrace/dnsrace/internal/lab"
)

// The soak runs a tracer through pod churn: pods are born and deleted
// continuously, each asking DNS through NAT in its own namespace (so the
// tracer reads its counters and, in the tracepoint tier, links its
// netfilter program there), and every SoakConfig.SampleEvery it samples
// what a leak would grow: the tracer's open files and RSS, the namespaces
// it holds, and the network namespaces the kernel has (its net_namespace
// slab objects). A tracer that holds on to deleted pods' namespaces grows
// all of them with every pod.

// SoakConfig configures Soak.
type SoakConfig struct {
	// Exe is the dnsrace binary whose tracer is soaked.
	Exe string
	// Duration of the churn (default 3m).
	Duration time.Duration
	// Pods alive at once (default 4); Every is how often the oldest is
	// deleted and a new one born in its place (default 500 ms).
	Pods  int
	Every time.Duration
	// SampleEvery (default 10 s).
	SampleEvery time.Duration
	// Prefix names the lab (default "dnsrace-soak").
	Prefix string
	// TraceArgs are extra arguments for the tracer.
	TraceArgs []string
	// Log, if set, gets a line per sample.
	Log func(string)
}

// SoakSample is one look at the tracer and the kernel.
type SoakSample struct {
	AtS      float64 `json:"at_s"`
	PodsBorn int     `json:"pods_born"`
	FDs      int     `json:"tracer_fds"`
	RSS      uint64  `json:"tracer_rss_bytes"`
	// Held and Released are the tracer's own counts (a checkpoint's
	// namespaces_held, namespaces_released).
	Held     int    `json:"namespaces_held"`
	Released uint64 `json:"namespaces_released"`
	// KernelNetNS is the network namespaces the kernel has: the active
	// objects of its net_namespace slab (freed ones leave it).
	KernelNetNS int `json:"kernel_net_namespaces"`
}

// SoakResult is what a soak measured.
type SoakResult struct {
	DurationS   float64      `json:"duration_s"`
	PodsBorn    int          `json:"pods_born"`
	PodsDeleted int          `json:"pods_deleted"`
	Asked       int          `json:"queries_asked"`
	Answered    int          `json:"queries_answered"`
	Samples     []SoakSample `json:"samples"`
	// Growth is, per sampled quantity, the largest value of the second
	// half of the samples minus that of the first half: a leak grows with
	// every pod, churn alone does not.
	Growth   map[string]float64 `json:"growth"`
	Flat     bool               `json:"flat"`
	Mismatch []string           `json:"mismatch"`
}

// soakLimits are the growth that still counts as flat: a few files and
// namespaces of churn in flight, a tenth of the RSS (the Go heap breathes).
var soakLimits = map[string]float64{"tracer_fds": 8, "namespaces_held": 8, "kernel_net_namespaces": 16, "tracer_rss_ratio": 0.10}

func (c *SoakConfig) defaults() {
	if c.Duration == 0 {
		c.Duration = 3 * time.Minute
	}
	if c.Pods == 0 {
		c.Pods = 4
	}
	if c.Every == 0 {
		c.Every = 500 * time.Millisecond
	}
	if c.SampleEvery == 0 {
		c.SampleEvery = 10 * time.Second
	}
	if c.Prefix == "" {
		c.Prefix = "dnsrace-soak"
	}
	if c.Log == nil {
		c.Log = func(string) {}
	}
}

// Soak churns pods under a tracer for cfg.Duration and samples it.
func Soak(ctx context.Context, cfg SoakConfig) (res *SoakResult, err error) {
	cfg.defaults()
	if cfg.Exe == "" {
		return nil, fmt.Errorf("soaking the tracer: no dnsrace binary given")
	}
	sc, err := lab.LookupScenario("local-out")
	if err != nil {
		return nil, err
	}
	_ = lab.Teardown(cfg.Prefix)
	l, err := lab.Up(sc.Topology(cfg.Prefix, cfg.Pods), sc.Server)
	if err != nil {
		return nil, fmt.Errorf("soaking the tracer: %w", err)
	}
	defer func() {
		if derr := l.Down(); derr != nil && err == nil {
			err = fmt.Errorf("tearing the soak's lab down: %w", derr)
		}
	}()
	tr, err := startTracer(cfg.Exe, cfg.Duration+2*time.Minute, cfg.TraceArgs)
	if err != nil {
		return nil, err
	}
	res = &SoakResult{}
	stopped := false
	defer func() {
		if !stopped {
			tr.kill()
		}
	}()

	start := time.Now()
	next := start
	sample := func() error {
		s, err := tr.soakSample()
		if err != nil {
			return err
		}
		s.AtS, s.PodsBorn = time.Since(start).Seconds(), res.PodsBorn
		res.Samples = append(res.Samples, s)
		cfg.Log(fmt.Sprintf("%6.0f s  pods born %5d  tracer fds %4d rss %6.1f MB  namespaces held %4d released %5d  kernel net namespaces %4d",
			s.AtS, s.PodsBorn, s.FDs, float64(s.RSS)/1e6, s.Held, s.Released, s.KernelNetNS))
		return nil
	}
	if err := sample(); err != nil {
		return nil, err
	}
	nextSample := start.Add(cfg.SampleEvery)
	for n := 0; time.Since(start) < cfg.Duration; n++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		i := n % cfg.Pods
		// The oldest pod goes as a CNI plugin and a runtime delete it;
		// a new one is born in its place and asks DNS at once.
		if err := l.UnplugPod(i); err != nil {
			return nil, err
		}
		if err := l.DeletePod(i); err != nil {
			return nil, err
		}
		res.PodsDeleted++
		if err := l.AddPod(i); err != nil {
			return nil, err
		}
		res.PodsBorn++
		for q := 0; q < 3; q++ {
			res.Asked++
			if lab.Ask(l.Topology.PodNS(i), lab.QName(n), 2*time.Second) == nil {
				res.Answered++
			}
		}
		if time.Now().After(nextSample) {
			if err := sample(); err != nil {
				return nil, err
			}
			nextSample = nextSample.Add(cfg.SampleEvery)
		}
		next = next.Add(cfg.Every)
		time.Sleep(time.Until(next))
	}
	if err := sample(); err != nil {
		return nil, err
	}
	res.DurationS = time.Since(start).Seconds()
	sum, _, err := tr.stop()
	stopped = true
	if err != nil {
		return nil, err
	}
	res.Mismatch = sum.Mismatch
	res.Growth, res.Flat = soakGrowth(res.Samples)
	return res, nil
}

// soakGrowth compares the second half of the samples with the first.
func soakGrowth(s []SoakSample) (map[string]float64, bool) {
	g := map[string]float64{}
	if len(s) < 4 {
		return g, false
	}
	half := len(s) / 2
	peak := func(part []SoakSample, f func(SoakSample) float64) float64 {
		m := f(part[0])
		for _, x := range part[1:] {
			m = max(m, f(x))
		}
		return m
	}
	grow := func(f func(SoakSample) float64) float64 { return peak(s[half:], f) - peak(s[:half], f) }
	g["tracer_fds"] = grow(func(x SoakSample) float64 { return float64(x.FDs) })
	g["namespaces_held"] = grow(func(x SoakSample) float64 { return float64(x.Held) })
	g["kernel_net_namespaces"] = grow(func(x SoakSample) float64 { return float64(x.KernelNetNS) })
	rss := grow(func(x SoakSample) float64 { return float64(x.RSS) })
	g["tracer_rss_ratio"] = rss / peak(s[:half], func(x SoakSample) float64 { return float64(x.RSS) })
	flat := true
	for k, limit := range soakLimits {
		flat = flat && g[k] <= limit
	}
	return g, flat
}

// soakSample reads the tracer's files, RSS and namespace counts (from a
// checkpoint it writes on SIGUSR1) and the kernel's namespace count.
func (t *tracerProc) soakSample() (SoakSample, error) {
	var s SoakSample
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", t.pid()))
	if err != nil {
		return s, fmt.Errorf("reading the tracer's open files: %w", err)
	}
	s.FDs = len(fds)
	if s.RSS, _, err = procMem(t.pid()); err != nil {
		return s, err
	}
	if s.KernelNetNS, err = kernelNetNamespaces(); err != nil {
		return s, err
	}
	cp, err := t.checkpoint()
	if err != nil {
		return s, err
	}
	s.Held, s.Released = cp.Held, cp.Released
	return s, nil
}

// checkpointCounts is the part of a checkpoint line the soak reads.
type checkpointCounts struct {
	Type     string `json:"type"`
	Held     int    `json:"namespaces_held"`
	Released uint64 `json:"namespaces_released"`
}

// checkpoint has the tracer write a checkpoint (SIGUSR1) and reads it
// back from the end of its output.
func (t *tracerProc) checkpoint() (checkpointCounts, error) {
	path := filepath.Join(t.dir, outputName)
	count := func() int {
		b, _ := os.ReadFile(path)
		return bytes.Count(b, []byte(`"type":"checkpoint"`))
	}
	before := count()
	if err := t.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		return checkpointCounts{}, fmt.Errorf("asking the tracer for a checkpoint: %w", err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if count() == before {
			continue
		}
		f, err := os.Open(path)
		if err != nil {
			return checkpointCounts{}, err
		}
		var last checkpointCounts
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			var c checkpointCounts
			if json.Unmarshal(sc.Bytes(), &c) == nil && c.Type == "checkpoint" {
				last = c
			}
		}
		f.Close()
		return last, nil
	}
	return checkpointCounts{}, fmt.Errorf("the tracer wrote no checkpoint within 10 s of SIGUSR1")
}

// kernelNetNamespaces is the active objects of the kernel's net_namespace
// slab cache (/proc/slabinfo): one per network namespace not yet freed.
func kernelNetNamespaces() (int, error) {
	b, err := os.ReadFile("/proc/slabinfo")
	if err != nil {
		return 0, fmt.Errorf("counting the kernel's network namespaces: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && f[0] == "net_namespace" {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("counting the kernel's network namespaces: no net_namespace cache in /proc/slabinfo")
}

// WriteSoakText writes a soak's result for a person.
func WriteSoakText(w io.Writer, r *SoakResult) {
	fmt.Fprintf(w, "soak: %.0f s, %d pods born and %d deleted, %d of %d queries answered\n",
		r.DurationS, r.PodsBorn, r.PodsDeleted, r.Answered, r.Asked)
	fmt.Fprintf(w, "%8s %9s %10s %12s %10s %10s %15s\n", "at_s", "pods", "fds", "rss_MB", "held", "released", "kernel_netns")
	for _, s := range r.Samples {
		fmt.Fprintf(w, "%8.0f %9d %10d %12.1f %10d %10d %15d\n", s.AtS, s.PodsBorn, s.FDs, float64(s.RSS)/1e6, s.Held, s.Released, s.KernelNetNS)
	}
	verdict := "flat"
	if !r.Flat {
		verdict = "GROWING"
	}
	fmt.Fprintf(w, "growth, second half's peak over the first's: fds %+.0f, held namespaces %+.0f, kernel namespaces %+.0f, RSS %+.1f%%: %s\n",
		r.Growth["tracer_fds"], r.Growth["namespaces_held"], r.Growth["kernel_net_namespaces"], 100*r.Growth["tracer_rss_ratio"], verdict)
	for _, m := range r.Mismatch {
		fmt.Fprintf(w, "mismatch: %s\n", m)
	}
}
