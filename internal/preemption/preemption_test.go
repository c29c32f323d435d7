package preemption

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// uname -v of Debian's kernels booted by make vmtest (cmd/vmtest).
const (
	debian612 = "#1 SMP PREEMPT_DYNAMIC Debian 6.12.117-1~deb12u1 (2026-11-14)\n"
	debian72  = "#1 SMP PREEMPT_DYNAMIC Debian 7.2.13-1 (2026-10-28)\n"
)

// config answers from config text, as kconfig.Lookup does from a file.
func config(text string) func(string) (string, string) {
	return func(opt string) (string, string) {
		for _, l := range strings.Split(text, "\n") {
			if v, ok := strings.CutPrefix(l, opt+"="); ok {
				return v, "/boot/config-test"
			}
		}
		return "n", "/boot/config-test"
	}
}

func TestDecide(t *testing.T) {
	// The preemption lines of Debian's configs.
	voluntary := "CONFIG_PREEMPT_BUILD=y\n# CONFIG_PREEMPT_NONE is not set\nCONFIG_PREEMPT_VOLUNTARY=y\n# CONFIG_PREEMPT is not set\nCONFIG_PREEMPT_DYNAMIC=y\n"
	lazy := "CONFIG_PREEMPT_BUILD=y\nCONFIG_ARCH_HAS_PREEMPT_LAZY=y\n# CONFIG_PREEMPT is not set\nCONFIG_PREEMPT_LAZY=y\nCONFIG_PREEMPT_DYNAMIC=y\n"
	for _, c := range []struct {
		name     string
		in       Inputs
		model    string
		preempts bool
		basis    string
	}{
		{"debugfs, 6.12", Inputs{Debugfs: "none (voluntary) full \n", Version: debian612}, "voluntary", false, DebugfsFile},
		{"debugfs, 7.2", Inputs{Debugfs: "full (lazy) \n", Version: debian72, Config: config(voluntary)}, "lazy", true, DebugfsFile},
		{"debugfs wins over the command line", Inputs{Debugfs: "none voluntary (full) lazy\n", Version: debian612, Cmdline: "preempt=voluntary"}, "full", true, DebugfsFile},
		{"a voluntary build", Inputs{Version: "#1 SMP Debian 5.10.223-1 (2024-08-10)\n"}, "none or voluntary", false, "uname -v"},
		{"a PREEMPT build", Inputs{Version: "#1 SMP PREEMPT Sat Jan 1 00:00:00 UTC 2026\n"}, "PREEMPT", true, "uname -v"},
		{"a PREEMPT_RT build", Inputs{Version: "#1 SMP PREEMPT_RT Debian 6.12.117-1\n", Config: config(voluntary)}, "PREEMPT_RT", true, "uname -v"},
		{"dynamic, the default voluntary", Inputs{Version: debian612, Cmdline: "BOOT_IMAGE=/vmlinuz ro quiet", Config: config(voluntary)}, "voluntary", false, "CONFIG_PREEMPT_VOLUNTARY in /boot/config-test"},
		{"dynamic, the default lazy", Inputs{Version: debian72, Config: config(lazy)}, "lazy", true, "CONFIG_PREEMPT_LAZY in /boot/config-test"},
		// 7.2 boots preempt=voluntary as lazy ("Dynamic Preempt: unsupported mode: voluntary").
		{"dynamic, a model asked on the command line", Inputs{Version: debian72, Cmdline: "console=ttyS0 preempt=voluntary", Config: config(lazy)}, "unknown", true, "preempt=voluntary"},
		{"dynamic, no config", Inputs{Version: debian612, Config: config("")}, "unknown", true, "nothing readable"},
		{"dynamic, no config reader", Inputs{Version: debian612}, "unknown", true, "nothing readable"},
		{"nothing", Inputs{}, "unknown", true, "nothing readable"},
	} {
		m := Decide(c.in)
		if m.Name != c.model || m.Preempts != c.preempts || !strings.Contains(m.Basis, c.basis) {
			t.Errorf("%s: %+v, want %s (preempts %v) from %q", c.name, m, c.model, c.preempts, c.basis)
		}
	}
}

// TestDetect reads the files of a root, as doctor reads a host's.
func TestDetect(t *testing.T) {
	dir := t.TempDir()
	open := func(p string) (*os.File, error) { return os.Open(filepath.Join(dir, p)) }
	write := func(p, text string) {
		t.Helper()
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if m := Detect(open, "7.2.13+deb14-cloud-amd64"); m.Name != "unknown" || !m.Preempts {
		t.Errorf("an empty root: %+v", m)
	}
	write(VersionFile, debian72)
	write(CmdlineFile, "console=ttyS0 panic=-1\n")
	write("/usr/lib/modules/7.2.13+deb14-cloud-amd64/config", "# CONFIG_PREEMPT is not set\nCONFIG_PREEMPT_LAZY=y\n")
	if m := Detect(open, "7.2.13+deb14-cloud-amd64"); m.Name != "lazy" || !m.Preempts || !strings.Contains(m.Basis, "/usr/lib/modules/7.2.13+deb14-cloud-amd64/config") {
		t.Errorf("7.2's files: %+v", m)
	}
	write(DebugfsFile, "full (lazy) \n")
	if m := Detect(open, "7.2.13+deb14-cloud-amd64"); m.Name != "lazy" || m.Basis != DebugfsFile {
		t.Errorf("with debugfs: %+v", m)
	}
}
