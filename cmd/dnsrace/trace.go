package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/probe"
	"github.com/dnsrace/dnsrace/internal/trace"
)

func init() {
	commands["trace"] = command{summary: "explain every DNS stall on this node, packet by packet", run: runTrace}
}

const traceUsage = `Usage: dnsrace trace [flags]

Attach eBPF programs to conntrack confirm, skb drop and packet tracepoints,
follow every DNS query to its answer, drop or retry, and print one line per
stall with its cause: insert_race (same_tuple or reply_clash, and the flow
that won), clash_resolved, table_full, rule_drop, reply_unmatched,
rcvbuf_full, no_reply, local_drop. At the end (--duration, Ctrl-C or
SIGTERM) the attributed packets are reconciled with the kernel's own
per-CPU conntrack counters.

Examples:
  sudo dnsrace trace
  sudo dnsrace trace --duration 10m --json > stalls.jsonl
  sudo dnsrace trace --list-probes
  sudo dnsrace trace --attach tracepoint --netns /run/netns/dnsrace-node
  sudo dnsrace trace --kernel-btf /var/lib/btf/$(uname -r).btf

Flags:
`

type traceFlags struct {
	attach     string
	listProbes bool
	kernelBTF  string
	port       uint16
	netns      string
	duration   time.Duration
	json       bool
	readyFile  string
	ringSize   uint32
	procRoot   string
}

func (f *traceFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.attach, "attach", "auto", "attach tier for the conntrack and send hooks: auto, fentry, kprobe or tracepoint")
	fs.BoolVar(&f.listProbes, "list-probes", false, "print each hook's attach tier and why, then exit")
	fs.StringVar(&f.kernelBTF, "kernel-btf", "", "BTF file for kernels without /sys/kernel/btf/vmlinux")
	fs.Uint16Var(&f.port, "port", 53, "DNS port to trace (filtered in the kernel)")
	fs.StringVar(&f.netns, "netns", "", "trace only this network namespace (a path like /run/netns/NAME or /proc/PID/ns/net, or an inode number)")
	fs.DurationVar(&f.duration, "duration", 0, "stop after this long and print the summary (default: until Ctrl-C)")
	fs.BoolVar(&f.json, "json", false, "write JSON Lines: one object per incident, then a summary object")
	fs.StringVar(&f.readyFile, "ready-file", "", "write this file once every probe is attached (for scripts)")
	fs.Uint32Var(&f.ringSize, "ring-buffer-size", probe.DefaultRingBufferSize, "ring buffer size in bytes (a power of two multiple of the page size)")
	fs.StringVar(&f.procRoot, "proc-root", "/proc", "where the host's /proc is (kubectl debug: /host/proc)")
}

// probeOptions checks the flags and the machine and returns probe options.
func (f *traceFlags) probeOptions() (probe.Options, error) {
	var o probe.Options
	if f.port == 0 {
		return o, usagef("--port must be 1-65535")
	}
	o.Port = f.port
	if f.attach != "auto" {
		t, err := event.ParseTier(f.attach)
		if err != nil {
			return o, usageError{err}
		}
		o.Attach = t
	}
	if f.ringSize < 4096 || f.ringSize&(f.ringSize-1) != 0 {
		return o, usagef("--ring-buffer-size %d: want a power of two of at least 4096", f.ringSize)
	}
	o.RingBufferSize = f.ringSize
	if f.duration < 0 {
		return o, usagef("--duration must not be negative")
	}
	if f.netns != "" {
		ino, err := netnsInode(f.netns)
		if err != nil {
			return o, usageError{err}
		}
		o.NetNS = ino
	}
	if f.kernelBTF != "" {
		if _, err := os.Stat(f.kernelBTF); err != nil {
			return o, usagef("--kernel-btf: %v", err)
		}
		o.KernelBTF = f.kernelBTF
	} else if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return o, errors.New("this kernel exposes no BTF (/sys/kernel/btf/vmlinux is missing): dnsrace needs CONFIG_DEBUG_INFO_BTF=y, or pass --kernel-btf FILE with this kernel's BTF")
	}
	return o, nil
}

func netnsInode(s string) (uint32, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return uint32(n), nil
	}
	var st syscall.Stat_t
	if err := syscall.Stat(s, &st); err != nil {
		return 0, fmt.Errorf("--netns %s: %w", s, err)
	}
	return uint32(st.Ino), nil
}

// checkConntrack fails clearly when nf_conntrack is not loaded: then no
// packet on the node is tracked and there is no insertion race to see.
func checkConntrack(procRoot string) error {
	p := filepath.Join(procRoot, "sys/net/netfilter/nf_conntrack_max")
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("nf_conntrack is not loaded (%s missing): nothing on this node is connection-tracked, so there is no insertion race to trace; load it with 'modprobe nf_conntrack' to trace the other causes anyway", p)
	}
	return nil
}

func runTrace(ctx context.Context, args []string) error {
	var f traceFlags
	fs := pflag.NewFlagSet("trace", pflag.ContinueOnError)
	f.register(fs)
	if err := parseFlags(fs, args, traceUsage); err != nil {
		return err
	}
	opts, err := f.probeOptions()
	if err != nil {
		return err
	}
	if err := requireRoot("dnsrace trace"); err != nil {
		return err
	}
	if err := checkConntrack(f.procRoot); err != nil {
		return err
	}
	s, err := trace.Start(trace.Options{Probe: opts, Out: os.Stdout, JSON: f.json, ReadyFile: f.readyFile, ProcRoot: f.procRoot})
	if err != nil {
		return fmt.Errorf("starting the tracer: %w", err)
	}
	if f.listProbes {
		printProbes(s.Probes())
		s.Stop()
		return nil
	}
	if !f.json {
		var tiers []string
		for _, p := range s.Probes() {
			if p.Attached {
				tiers = append(tiers, p.Hook+"="+p.Tier.String())
			}
		}
		fmt.Fprintf(os.Stderr, "tracing DNS on port %d (%s); Ctrl-C to stop\n", f.port, strings.Join(tiers, " "))
	}
	if f.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.duration)
		defer cancel()
	}
	<-ctx.Done()
	sum := s.Stop()
	trace.WriteSummary(os.Stdout, sum, f.json)
	return nil
}

// printProbes lists each hook's tier, and why a better tier was not used.
func printProbes(ps []probe.ProbeInfo) {
	fmt.Printf("%-24s %-10s %-8s %s\n", "HOOK", "TIER", "ATTACHED", "PROGRAM")
	for _, p := range ps {
		fmt.Printf("%-24s %-10s %-8v %s\n", p.Hook, p.Tier, p.Attached, p.Program)
		if p.Err != nil {
			for _, line := range strings.Split(p.Err.Error(), "\n") {
				fmt.Printf("    %s\n", line)
			}
		}
	}
}
