package vmtest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Machine is how guests are booted.
type Machine struct {
	Accel     string // tcg or kvm
	TCGThread string // single or multi (docs/vmtest.md, "The int3 oops")
	SMP, Mem  int
	// KernelArgs are added to every guest's kernel command line (e.g.
	// "preempt=full": docs/kernel.md §12).
	KernelArgs string
}

// cmdline is the kernel command line. no_timer_check (x86): under a loaded
// host, 6.1 guests printed "..MP-BIOS bug: 8254 timer not connected to
// IO-APIC" and stalled; VMs usually skip that early check.
func cmdline(arch string) string {
	if arch == "arm64" {
		return "console=ttyAMA0 panic=-1 quiet loglevel=4 mitigations=off"
	}
	return "console=ttyS0 panic=-1 quiet loglevel=4 mitigations=off no_timer_check"
}

// qemuArgs is the qemu command of a guest.
func (m Machine) qemuArgs(arch, vmlinuz, initrd, append_ string) []string {
	accel := m.Accel
	if accel == "tcg" {
		accel = "tcg,thread=" + m.TCGThread
	}
	qemu := envOr("DNSRACE_VMTEST_QEMU", "qemu-system-x86_64")
	machine := []string{"-cpu", "max"}
	if arch == "arm64" {
		qemu = envOr("DNSRACE_VMTEST_QEMU_ARM64", "qemu-system-aarch64")
		// pauth-impdef: pointer authentication with QEMU's cheap hash, not the
		// architected QARMA5 cipher the kernel runs on every function return.
		machine = []string{"-machine", "virt", "-cpu", "max,pauth-impdef=on"}
	}
	args := append([]string{qemu, "-accel", accel}, machine...)
	return append(args, "-smp", strconv.Itoa(m.SMP), "-m", strconv.Itoa(m.Mem),
		"-nodefaults", "-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot",
		"-kernel", vmlinuz, "-initrd", initrd, "-append", strings.Join(strings.Fields(cmdline(arch)+" "+m.KernelArgs+" "+append_), " "))
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Boot runs one guest until it powers off or timeout passes (then it is
// killed), with its console appended to logFile; follow, if set, sees every
// console line as it comes. The plan line opens the log and the host line
// ends it.
func (m Machine) Boot(ctx context.Context, plan GuestPlan, vmlinuz, initrd, append_ string, timeout time.Duration, logFile string, follow func(string)) (HostResult, error) {
	var hr HostResult
	f, err := os.Create(logFile)
	if err != nil {
		return hr, err
	}
	defer f.Close()
	p, _ := json.Marshal(plan)
	fmt.Fprintf(f, "VMTEST-PLAN %s\n", p)

	gctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	args := m.qemuArgs(plan.Arch, vmlinuz, initrd, append_)
	cmd := exec.CommandContext(gctx, args[0], args[1:]...)
	// A harness killed outright takes its guests along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return hr, fmt.Errorf("starting %s: %w", args[0], err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		br := bufio.NewReader(pr)
		for {
			line, err := br.ReadString('\n')
			f.WriteString(line)
			if follow != nil && line != "" {
				follow(strings.TrimRight(line, "\r\n"))
			}
			if err != nil {
				return
			}
		}
	}()
	werr := cmd.Wait()
	pw.Close()
	<-done
	hr.Seconds = time.Since(start).Seconds()
	hr.RC = cmd.ProcessState.ExitCode()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		hr.RC = 128 + int(ws.Signal())
	}
	hr.TimedOut = errors.Is(gctx.Err(), context.DeadlineExceeded)
	hl, _ := json.Marshal(hr)
	fmt.Fprintf(f, "\nVMTEST-HOST %s\n", hl)
	if ctx.Err() != nil {
		return hr, ctx.Err()
	}
	var ee *exec.ExitError
	if werr != nil && !errors.As(werr, &ee) {
		return hr, fmt.Errorf("running %s: %w", args[0], werr)
	}
	return hr, nil
}
