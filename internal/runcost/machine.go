package runcost

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/dnsrace/dnsrace/internal/kconfig"
)

// Machine holds what decides the cost of a run besides the program: the
// page-table isolation and whether the CPU tags TLB entries (PCID: without
// it every kernel entry and exit flushes the TLB), the indirect-call
// mitigation (the program is called indirectly), and the clock source
// (run-time statistics read it twice a run).
type Machine struct {
	Kernel      string `json:"kernel"`
	CPU         string `json:"cpu"`
	Hypervisor  bool   `json:"hypervisor"`
	PCID        bool   `json:"pcid"`
	Meltdown    string `json:"meltdown"`
	SpectreV2   string `json:"spectre_v2"`
	Clocksource string `json:"clocksource"`
}

// ReadMachine reads them from /proc and /sys; what cannot be read stays
// empty.
func ReadMachine() Machine {
	m := Machine{
		Kernel:      kconfig.Release(),
		Meltdown:    readLine("/sys/devices/system/cpu/vulnerabilities/meltdown"),
		SpectreV2:   readLine("/sys/devices/system/cpu/vulnerabilities/spectre_v2"),
		Clocksource: readLine("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
	}
	b, _ := os.ReadFile("/proc/cpuinfo")
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name":
			if m.CPU == "" {
				m.CPU = strings.TrimSpace(v)
			}
		case "flags":
			for _, f := range strings.Fields(v) {
				switch f {
				case "pcid":
					m.PCID = true
				case "hypervisor":
					m.Hypervisor = true
				}
			}
		}
	}
	return m
}

func readLine(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

// WriteText prints the machine, the call costs and a table of results per
// trigger.
func WriteText(w io.Writer, m Machine, c Call, rs []Result) {
	virt := "bare metal"
	if m.Hypervisor {
		virt = "virtual machine"
	}
	pcid := "no PCID (every kernel entry and exit flushes the TLB while page-table isolation is on)"
	if m.PCID {
		pcid = "PCID"
	}
	fmt.Fprintf(w, "kernel %s, %s, %s\n  meltdown: %s; %s\n  spectre_v2: %s\n  clocksource: %s\n",
		m.Kernel, m.CPU, virt, m.Meltdown, pcid, m.SpectreV2, m.Clocksource)
	if c.DirectNs > 0 {
		fmt.Fprintf(w, "an empty program run by BPF_PROG_TEST_RUN: %.0f ns called directly (XDP), %.0f ns called indirectly (socket filter)\n", c.DirectNs, c.IndirectNs)
	}
	trigger := ""
	for _, r := range rs {
		if r.Trigger != trigger {
			trigger = r.Trigger
			for _, t := range Triggers {
				if t.Name == trigger {
					fmt.Fprintf(w, "\n%s: %s\n", t.Name, t.What)
				}
			}
			fmt.Fprintf(w, "  %-13s %10s %10s  %s\n", "variant", "ns/fire", "ns/run", "what one run does")
		}
		extra := ""
		if r.KernelRuns > 0 {
			extra = fmt.Sprintf(" (the kernel's own account: %.1f ns a run over %d runs)", r.KernelNsPerRun, r.KernelRuns)
		}
		if r.Misses > 0 {
			extra += fmt.Sprintf(" (%d recursion misses)", r.Misses)
		}
		run := fmt.Sprintf("%10.1f", r.NsPerRun)
		if r.Variant == "none" {
			run = fmt.Sprintf("%10s", "-")
		}
		fmt.Fprintf(w, "  %-13s %10.1f %s  %s%s\n", r.Variant, r.NsPerFire, run, r.What, extra)
	}
}
