package doctor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/clashfix"
	"github.com/dnsrace/dnsrace/internal/kconfig"
	"github.com/dnsrace/dnsrace/internal/preemption"
)

// kernelConfig returns the value of a CONFIG_ option ("y", "m", "n" for
// "is not set", "" when unknown) and where it was read, inside the root.
func (e *env) kernelConfig(opt string, release string) (string, string) {
	return kconfig.Lookup(e.open, release, opt)
}

// open opens p inside the root.
func (e *env) open(p string) (*os.File, error) {
	real, _, err := resolveIn(e.Root, p)
	if err != nil {
		return nil, err
	}
	return os.Open(real)
}

// fentryTrial loads a two-instruction fentry program on
// __nf_conntrack_confirm: the only sure way to know whether this kernel
// (and its LSMs) lets dnsrace trace use the fentry tier.
func fentryTrial(attachType ebpf.AttachType, target string) error {
	spec := &ebpf.ProgramSpec{
		Name:         "dnsrace_probe",
		Type:         ebpf.Tracing,
		AttachType:   attachType,
		AttachTo:     target,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	}
	prog, err := ebpf.NewProgram(spec)
	if err != nil {
		return err
	}
	return prog.Close()
}

// checkTracing: which attach tier would `dnsrace trace` get here, and why?
// fentry/fexit (needs BTF and a kernel that loads tracing programs), else
// kprobes (CONFIG_KPROBES, not locked down to confidentiality), else the
// tracepoint tier (skb:kfree_skb, counters).
func checkTracing(_ context.Context, e *env) Result {
	var r Result
	release := ""
	if b, _, err := e.read("/proc/sys/kernel/osrelease"); err == nil {
		release = strings.TrimSpace(string(b))
	}
	// BTF.
	btfOK := false
	if real, _, err := resolveIn(e.Root, "/sys/kernel/btf/vmlinux"); err == nil {
		if fi, err := os.Stat(real); err == nil && fi.Mode().IsRegular() {
			btfOK = true
			r.Evidence = append(r.Evidence, fmt.Sprintf("/sys/kernel/btf/vmlinux: present (%d KiB)", fi.Size()/1024))
		}
	}
	if !btfOK {
		r.Evidence = append(r.Evidence, "/sys/kernel/btf/vmlinux: absent (no CO-RE without an external BTF; no fentry)")
	}
	// Lockdown.
	lockdown := ""
	if b, _, err := e.read("/sys/kernel/security/lockdown"); err == nil {
		s := string(b)
		if i, j := strings.IndexByte(s, '['), strings.IndexByte(s, ']'); i >= 0 && j > i {
			lockdown = s[i+1 : j]
		}
		r.Evidence = append(r.Evidence, "/sys/kernel/security/lockdown: "+strings.TrimSpace(s))
	} else if b, _, err := e.read("/proc/cmdline"); err == nil && strings.Contains(string(b), "lockdown=") {
		for _, w := range strings.Fields(string(b)) {
			if v, ok := strings.CutPrefix(w, "lockdown="); ok {
				lockdown = v
				r.Evidence = append(r.Evidence, "/proc/cmdline: lockdown="+v+" (securityfs not mounted)")
			}
		}
	} else {
		r.Evidence = append(r.Evidence, "lockdown: unknown (securityfs not mounted at /sys/kernel/security)")
	}
	// kprobes.
	kprobes := "unknown"
	cfg, cfgFrom := e.kernelConfig("CONFIG_KPROBES", release)
	switch cfg {
	case "y":
		kprobes = "yes"
		r.Evidence = append(r.Evidence, cfgFrom+": CONFIG_KPROBES=y")
	case "n":
		kprobes = "no"
		r.Evidence = append(r.Evidence, cfgFrom+": CONFIG_KPROBES is not set")
	}
	for _, tr := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
		if !e.exists(tr+"/available_events") && !e.exists(tr+"/trace") {
			continue
		}
		if e.exists(tr + "/kprobe_events") {
			if kprobes == "unknown" {
				kprobes = "yes"
			}
			r.Evidence = append(r.Evidence, tr+"/kprobe_events: present")
		} else {
			kprobes = "no"
			r.Evidence = append(r.Evidence, tr+" mounted but has no kprobe_events")
		}
		break
	}
	if lockdown == "confidentiality" {
		kprobes = "no"
		r.Evidence = append(r.Evidence, "lockdown=confidentiality refuses kprobes and bpf_probe_read_kernel")
	}

	// Where the kernel preempts kernel code, the hooks that run in a task
	// (confirm of a local socket's packet, the sends, the reads) take
	// kprobes: a preempted fentry program skips its runs on that CPU
	// (internal/probe, docs/kernel.md §12).
	preempt := preemption.Detect(e.open, release)
	r.Evidence = append(r.Evidence, "preemption model: "+preempt.String())

	// fentry, tp_btf: live trial loads only.
	fentry, tpbtf := "unknown", "unknown"
	switch {
	case !btfOK:
		fentry, tpbtf = "no", "no"
		r.Evidence = append(r.Evidence, "fentry and tp_btf need vmlinux BTF")
	case e.Live:
		// Rule out the memlock rlimit (pre-5.11 accounting) as the cause
		// of an EPERM, so what is reported is the kernel's refusal.
		_ = rlimit.RemoveMemlock()
		// The feature probe itself loads an fentry program; report it, but
		// try both real shapes anyway: tp_btf can load where fentry cannot.
		if err := features.HaveProgramType(ebpf.Tracing); err != nil {
			r.Evidence = append(r.Evidence, "features.HaveProgramType(Tracing): "+err.Error())
		} else {
			r.Evidence = append(r.Evidence, "features.HaveProgramType(Tracing): supported")
		}
		if err := fentryTrial(ebpf.AttachTraceFEntry, "__nf_conntrack_confirm"); err != nil {
			fentry = "no"
			r.Evidence = append(r.Evidence, "trial load fentry/__nf_conntrack_confirm: "+shortErr(err))
		} else {
			fentry = "yes"
			r.Evidence = append(r.Evidence, "trial load fentry/__nf_conntrack_confirm: ok")
		}
		if err := fentryTrial(ebpf.AttachTraceRawTp, "kfree_skb"); err != nil {
			tpbtf = "no"
			r.Evidence = append(r.Evidence, "trial load tp_btf/kfree_skb: "+shortErr(err))
		} else {
			tpbtf = "yes"
			r.Evidence = append(r.Evidence, "trial load tp_btf/kfree_skb: ok")
		}
	default:
		r.Evidence = append(r.Evidence, "fentry and tp_btf trial loads skipped: not live (--root without --live)")
	}

	// dnsrace trace (internal/probe) attaches its tracepoint hooks with
	// tp_btf programs and relocates with CO-RE, so kernel BTF is required
	// whatever tier the confirm/clash hooks get; those use fentry/fexit,
	// else kprobe/kretprobe, else nothing (tracepoint-only).
	switch {
	case !btfOK && release == "" && kprobes == "unknown":
		return Result{Verdict: Skip, Evidence: r.Evidence,
			Reason: "nothing under the root describes the kernel (no osrelease, BTF, config or tracefs)"}
	case !btfOK:
		r.Verdict = Fail
		r.Summary = fmt.Sprintf("dnsrace trace cannot run here: no kernel BTF for its tp_btf hooks and CO-RE (kprobes %s)", kprobes)
		r.Fix = "use a kernel built with CONFIG_DEBUG_INFO_BTF=y (/sys/kernel/btf/vmlinux), or give dnsrace trace an external BTF file for this exact kernel"
	case tpbtf == "no":
		r.Verdict = Fail
		r.Summary = "dnsrace trace cannot run here: tp_btf programs are refused"
		r.Fix = "check the BPF LSM policy and kernel.unprivileged_bpf_disabled; run as root with CAP_BPF and CAP_PERFMON"
	case fentry == "yes" && preempt.Preempts && kprobes != "no":
		r.Verdict, r.Summary = OK, "dnsrace trace gets kprobes on __nf_conntrack_confirm, the sends and the reads, fentry on nf_ct_resolve_clash, a perf tracepoint on kfree_skb: this kernel preempts kernel code, where a fentry or tp_btf program in a task makes its other runs skip"
	case fentry == "yes" && preempt.Preempts:
		r.Verdict = Warn
		r.Summary = "dnsrace trace gets the fentry/fexit tier, but this kernel preempts kernel code and has no kprobes: runs of the hooks in a task (confirm of a local socket's packet, the sends, the reads) can be skipped, counted as recursion misses"
		r.Fix = "use a kernel with CONFIG_KPROBES=y: the hooks in a task then take kprobes, which run with preemption off"
	case fentry == "yes":
		r.Verdict, r.Summary = OK, "dnsrace trace gets the fentry/fexit tier (per-packet clash outcome on __nf_conntrack_confirm)"
	case kprobes == "yes" && fentry == "no":
		r.Verdict, r.Summary = OK, "dnsrace trace gets the kprobe tier (fentry refused; kretprobe on __nf_conntrack_confirm)"
	case kprobes == "yes":
		// Files only: BTF and kprobes are there; whether fentry loads
		// needs a trial on the node.
		r.Verdict, r.Summary = OK, "dnsrace trace gets the kprobe tier or better (BTF and CONFIG_KPROBES present; fentry needs a trial load: --live)"
	case fentry == "unknown":
		return Result{Verdict: Skip, Evidence: r.Evidence,
			Reason: fmt.Sprintf("the tier needs a live trial load (BTF present, kprobes %s): rerun with --live on the node", kprobes)}
	default:
		r.Verdict = Warn
		r.Summary = fmt.Sprintf("dnsrace trace runs in the tracepoint tier only (fentry refused, kprobes %s): queries followed on every device, winners named from the entries seen confirmed, %s; it costs more per packet than the function tiers", kprobes, mergedLosersSeen(release))
		r.Fix = "for confirm's own verdicts and no per-packet device hooks run on a kernel that loads fentry programs (BPF LSM and lockdown permitting) or has CONFIG_KPROBES=y; the tracepoint tier still explains and counts every loss"
	}
	return r
}

// mergedLosersSeen says how the tracepoint tier sees a clash loser the
// kernel merged into the winner's entry on a kernel of this release, as
// internal/probe picks it: a netfilter program just before confirm from
// Linux 6.4 (BPF_PROG_TYPE_NETFILTER), the loser's unconfirmed entry freed
// (kmem_cache_free) before.
func mergedLosersSeen(release string) string {
	v, err := clashfix.ParseRelease(release)
	switch {
	case err != nil:
		return "merged losers by a netfilter program just before confirm (Linux 6.4+), before 6.4 by their unconfirmed entries freed (kmem_cache_free)"
	case v.AtLeast(6, 4):
		return "merged losers by a netfilter program just before confirm"
	}
	return "merged losers by their unconfirmed entries freed (kmem_cache_free)"
}

func shortErr(err error) string {
	if errors.Is(err, unix.EPERM) {
		return "refused with EPERM (operation not permitted: the kernel or an LSM forbids this program type here)"
	}
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		return fmt.Sprintf("%-3v", ve)
	}
	return err.Error()
}
