package testutil

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/dnsrace/dnsrace/internal/kconfig"
	"github.com/dnsrace/dnsrace/internal/preemption"
)

// FentryLimit says why this kernel cannot give dnsrace the fentry tier, or
// "" if it can. It asks the kernel directly, not dnsrace's loader: a trivial
// fentry program must attach to udp_sendmsg (arm64 kernels before 6.4 lack
// ftrace direct calls, e.g. Debian's 6.1), and nf_conntrack, when it is a
// module, must have BTF (5.11+, CONFIG_DEBUG_INFO_BTF_MODULES; Debian 11's
// 5.10 has none). On a kernel that preempts kernel code the hooks that run
// in a task may not use fentry either (internal/preemption; this asks the
// same package the loader asks).
func FentryLimit() string {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.Tracing, AttachType: ebpf.AttachTraceFEntry, AttachTo: "udp_sendmsg", License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		return fmt.Sprintf("a fentry program does not load: %v", err)
	}
	defer prog.Close()
	l, err := link.AttachTracing(link.TracingOptions{Program: prog})
	if err != nil {
		return fmt.Sprintf("a fentry program does not attach to udp_sendmsg: %v", err)
	}
	l.Close()
	if _, err := os.Stat("/sys/module/nf_conntrack/initstate"); err == nil { // a module, not built in
		if _, err := os.Stat("/sys/kernel/btf/nf_conntrack"); errors.Is(err, os.ErrNotExist) {
			return "nf_conntrack has no BTF (/sys/kernel/btf/nf_conntrack)"
		}
	}
	if m := preemption.Detect(os.Open, kconfig.Release()); m.Preempts {
		return "this kernel preempts kernel code (" + m.String() + "): the hooks that run in a task take kprobes"
	}
	return ""
}

// KprobeLimit says why this kernel cannot give dnsrace the kprobe tier by
// legacy kprobes, or "" if it can: a trivial kprobe program must attach to
// udp_sendmsg (CONFIG_KPROBES).
func KprobeLimit() string {
	return kprobeLimit(func(p *ebpf.Program) (link.Link, error) { return link.Kprobe("udp_sendmsg", p, nil) }, ebpf.AttachNone)
}

// KprobeMultiLimit is KprobeLimit for kprobe.multi links (fprobe: 5.18+,
// CONFIG_FPROBE).
func KprobeMultiLimit() string {
	return kprobeLimit(func(p *ebpf.Program) (link.Link, error) {
		return link.KprobeMulti(p, link.KprobeMultiOptions{Symbols: []string{"udp_sendmsg"}})
	}, ebpf.AttachTraceKprobeMulti)
}

func kprobeLimit(attach func(*ebpf.Program) (link.Link, error), at ebpf.AttachType) string {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.Kprobe, AttachType: at, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		return fmt.Sprintf("a kprobe program does not load: %v", err)
	}
	defer prog.Close()
	l, err := attach(prog)
	if err != nil {
		return fmt.Sprintf("a kprobe program does not attach to udp_sendmsg: %v", err)
	}
	l.Close()
	return ""
}
