package overhead

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// TraceSummary is the part of `dnsrace trace --json`'s summary line the
// harness reads.
type TraceSummary struct {
	Events     uint64   `json:"events"`
	EventBytes uint64   `json:"event_bytes"`
	EventsLost uint64   `json:"events_lost"`
	Malformed  uint64   `json:"events_malformed"`
	Mismatch   []string `json:"mismatch"`
	// RecursionMisses: by program, hook calls the kernel skipped.
	RecursionMisses map[string]uint64 `json:"recursion_misses"`
	Queries         struct {
		Queries  uint64 `json:"queries"`
		Answered uint64 `json:"answered"`
		InFlight int    `json:"in_flight"`
		Evicted  uint64 `json:"evicted"`
	} `json:"queries"`
	// KernelFlows: the kernel side's flows, for a round that did not
	// follow its answers.
	KernelFlows struct {
		Started    uint64 `json:"started"`
		Answered   uint64 `json:"answered"`
		Live       uint64 `json:"live"`
		Unanswered uint64 `json:"ended_unanswered"`
	} `json:"kernel_flows"`
}

// Skipped is how many hook calls the kernel did not run the tracer's
// programs for (recursion misses, all programs).
func (s *TraceSummary) Skipped() uint64 {
	var n uint64
	for _, m := range s.RecursionMisses {
		n += m
	}
	return n
}

// outputName is the tracer's output file in its directory.
const outputName = "out.jsonl"

// tracerProc is a `dnsrace trace --json` child process.
type tracerProc struct {
	cmd    *exec.Cmd
	errb   bytes.Buffer
	dir    string
	exited chan error
	// causes: the incidents stop read, by cause.
	causes map[string]int
}

// startTracer runs exe's trace subcommand and waits until every probe is
// attached. The tracer stops by itself after limit (a safety net: stop
// ends it long before). No Pdeathsig: it fires when the forking OS thread
// exits, and nsutil.Do may lock that very thread and throw it away.
func startTracer(exe string, limit time.Duration, extra []string) (*tracerProc, error) {
	dir, err := os.MkdirTemp("", "dnsrace-bench-")
	if err != nil {
		return nil, err
	}
	ready := filepath.Join(dir, "ready")
	// The tracer writes to a file, read after the round, not to a pipe
	// this process drains: a flood closes tens of thousands of incidents a
	// second, and draining them into memory was this process's work on the
	// CPUs the flood and the tracer share.
	args := append([]string{"trace", "--json", "--ready-file", ready, "--output-file", filepath.Join(dir, outputName),
		"--duration", limit.String()}, extra...)
	t := &tracerProc{cmd: exec.Command(exe, args...), dir: dir, exited: make(chan error, 1)}
	t.cmd.Stderr = &t.errb // stdout stays empty: everything goes to the file
	if err := t.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting the tracer: %w", err)
	}
	go func() { t.exited <- t.cmd.Wait() }()
	deadline := time.After(60 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			return t, nil
		}
		select {
		case err := <-t.exited:
			os.RemoveAll(dir)
			return nil, fmt.Errorf("tracer exited before it was ready (%v): %s", err, bytes.TrimSpace(t.errb.Bytes()))
		case <-deadline:
			t.kill()
			return nil, errors.New("tracer not ready within 60s")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (t *tracerProc) pid() int { return t.cmd.Process.Pid }

func (t *tracerProc) kill() {
	_ = t.cmd.Process.Kill()
	<-t.exited
	os.RemoveAll(t.dir)
}

// stop sends SIGTERM, waits for the summary and returns it with the
// number of incident lines.
func (t *tracerProc) stop() (*TraceSummary, int, error) {
	defer os.RemoveAll(t.dir)
	_ = t.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-t.exited:
	case <-time.After(60 * time.Second):
		// SIGQUIT: the Go runtime prints every goroutine's stack.
		_ = t.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-t.exited:
		case <-time.After(5 * time.Second):
			_ = t.cmd.Process.Kill()
			<-t.exited
		}
		return nil, 0, fmt.Errorf("tracer did not stop within 60s of SIGTERM; its stacks:\n%s", hungStacks(t.errb.Bytes(), 6000))
	}
	var sum *TraceSummary
	incidents := 0
	f, err := os.Open(filepath.Join(t.dir, outputName))
	if err != nil {
		return nil, 0, fmt.Errorf("reading the tracer's output: %w (%s)", err, bytes.TrimSpace(t.errb.Bytes()))
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var head struct {
			Type  string `json:"type"`
			Cause string `json:"cause"`
		}
		if json.Unmarshal(sc.Bytes(), &head) != nil {
			continue
		}
		switch head.Type {
		case "incident":
			incidents++
			if t.causes == nil {
				t.causes = map[string]int{}
			}
			t.causes[head.Cause]++
		case "summary":
			sum = &TraceSummary{}
			if err := json.Unmarshal(sc.Bytes(), sum); err != nil {
				return nil, incidents, fmt.Errorf("decoding the tracer's summary: %w", err)
			}
		}
	}
	if sum == nil {
		return nil, incidents, fmt.Errorf("tracer wrote no summary: %s", bytes.TrimSpace(t.errb.Bytes()))
	}
	return sum, incidents, nil
}
