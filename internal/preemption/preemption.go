package preemption

import (
	"io"
	"strings"

	"github.com/dnsrace/dnsrace/internal/kconfig"
)

// Where Detect reads.
const (
	DebugfsFile = "/sys/kernel/debug/sched/preempt"
	VersionFile = "/proc/sys/kernel/version" // uname -v
	CmdlineFile = "/proc/cmdline"
)

// Model is the kernel's preemption model.
type Model struct {
	// Name is the model as the kernel names it (none, voluntary, full,
	// lazy), PREEMPT or PREEMPT_RT for a build with one model, or unknown.
	Name string
	// Preempts: kernel code in a task can be preempted (full, lazy, a
	// PREEMPT or PREEMPT_RT build), or the model is unknown.
	Preempts bool
	// Basis says where Name was read.
	Basis string
}

func (m Model) String() string { return m.Name + ", from " + m.Basis }

// Inputs are the texts Decide reads: each "" when it could not be read.
type Inputs struct {
	Debugfs string // DebugfsFile, e.g. "none voluntary (full) lazy"
	Version string // VersionFile, e.g. "#1 SMP PREEMPT_DYNAMIC Debian 6.12.117-1"
	Cmdline string // CmdlineFile
	// Config looks a CONFIG_ option of the running kernel's build up: its
	// value ("y", "n") and the file it came from, "" and "" when no file
	// was read (kconfig.Lookup).
	Config func(opt string) (value, where string)
}

// Detect reads the running kernel's model through open; release names the
// running kernel's config file (kconfig.Release).
func Detect(open kconfig.Opener, release string) Model {
	read := func(p string) string {
		f, err := open(p)
		if err != nil {
			return ""
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, 64<<10))
		if err != nil {
			return ""
		}
		return string(b)
	}
	return Decide(Inputs{
		Debugfs: read(DebugfsFile),
		Version: read(VersionFile),
		Cmdline: read(CmdlineFile),
		Config:  func(opt string) (string, string) { return kconfig.Lookup(open, release, opt) },
	})
}

// defaults: the build's default model of a PREEMPT_DYNAMIC kernel, by the
// Kconfig choice that names it.
var defaults = []struct{ opt, name string }{
	{"CONFIG_PREEMPT_NONE", "none"},
	{"CONFIG_PREEMPT_VOLUNTARY", "voluntary"},
	{"CONFIG_PREEMPT", "full"},
	{"CONFIG_PREEMPT_LAZY", "lazy"},
}

// Decide is Detect's decision over what it read.
func Decide(in Inputs) Model {
	if name := current(in.Debugfs); name != "" {
		return model(name, DebugfsFile)
	}
	flags := strings.Fields(in.Version)
	has := func(f string) bool {
		for _, g := range flags {
			if g == f {
				return true
			}
		}
		return false
	}
	switch {
	case in.Version == "":
	case has("PREEMPT_RT"):
		return Model{Name: "PREEMPT_RT", Preempts: true, Basis: "uname -v (a PREEMPT_RT build)"}
	case has("PREEMPT"):
		return Model{Name: "PREEMPT", Preempts: true, Basis: "uname -v (a PREEMPT build: full or lazy)"}
	case !has("PREEMPT_DYNAMIC"):
		return Model{Name: "none or voluntary", Basis: "uname -v (no PREEMPT flag: a none or voluntary build)"}
	}
	for _, arg := range strings.Fields(in.Cmdline) {
		if v, ok := strings.CutPrefix(arg, "preempt="); ok {
			// A kernel falls back to its default for a model it lacks:
			// only the preempting ones are sure to preempt.
			return Model{Name: "unknown", Preempts: true, Basis: CmdlineFile + " (preempt=" + v + ", which the kernel may have refused)"}
		}
	}
	if in.Version != "" && in.Config != nil {
		for _, d := range defaults {
			if v, where := in.Config(d.opt); v == "y" {
				return model(d.name, "the build's default ("+d.opt+" in "+where+"), no preempt= on "+CmdlineFile)
			}
		}
	}
	return Model{Name: "unknown", Preempts: true, Basis: "nothing readable: " + DebugfsFile + " (debugfs not mounted?), uname -v, the kernel config"}
}

func model(name, basis string) Model {
	return Model{Name: name, Preempts: name != "none" && name != "voluntary", Basis: basis}
}

// current is the model DebugfsFile marks as in use, "(full)", or "".
func current(s string) string {
	for _, f := range strings.Fields(s) {
		if len(f) > 2 && f[0] == '(' && f[len(f)-1] == ')' {
			return f[1 : len(f)-1]
		}
	}
	return ""
}
