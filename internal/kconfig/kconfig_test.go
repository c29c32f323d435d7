package kconfig

import (
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// rooted opens paths inside dir, as doctor's root does.
func rooted(dir string) Opener {
	return func(p string) (*os.File, error) { return os.Open(filepath.Join(dir, p)) }
}

func write(t *testing.T, dir, p, text string, gz bool) {
	t.Helper()
	full := filepath.Join(dir, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(full)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !gz {
		f.WriteString(text)
		return
	}
	z := gzip.NewWriter(f)
	z.Write([]byte(text))
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestLookup(t *testing.T) {
	dir := t.TempDir()
	open := rooted(dir)
	if v, where := Lookup(open, "6.1.0-1", "CONFIG_HZ"); v != "" || where != "" {
		t.Fatalf("no config files: %q from %q", v, where)
	}

	write(t, dir, "/boot/config-6.1.0-1", "CONFIG_HZ_250=y\nCONFIG_HZ=250\n# CONFIG_KPROBES is not set\n", false)
	for _, c := range []struct{ opt, release, value, where string }{
		{"CONFIG_HZ", "6.1.0-1", "250", "/boot/config-6.1.0-1"},
		{"CONFIG_KPROBES", "6.1.0-1", "n", "/boot/config-6.1.0-1"},
		{"CONFIG_BPF", "6.1.0-1", "n", "/boot/config-6.1.0-1"},
		{"CONFIG_HZ", "6.1.0-2", "", ""}, // another kernel's file is not this one's
		{"CONFIG_HZ", "", "", ""},
	} {
		if v, where := Lookup(open, c.release, c.opt); v != c.value || where != c.where {
			t.Errorf("Lookup(%s, %s) = %q from %q, want %q from %q", c.release, c.opt, v, where, c.value, c.where)
		}
	}

	// Debian's Linux 7 packages have no /boot: the config is beside the
	// modules.
	write(t, dir, "/usr/lib/modules/7.2.13+deb14-cloud-amd64/config", "CONFIG_PREEMPT_LAZY=y\n", false)
	if v, where := Lookup(open, "7.2.13+deb14-cloud-amd64", "CONFIG_PREEMPT_LAZY"); v != "y" || where != "/usr/lib/modules/7.2.13+deb14-cloud-amd64/config" {
		t.Errorf("the modules' config: %q from %q", v, where)
	}

	// /proc/config.gz is the running kernel's own: it wins.
	write(t, dir, "/proc/config.gz", "CONFIG_HZ=1000\n", true)
	if v, where := Lookup(open, "6.1.0-1", "CONFIG_HZ"); v != "1000" || where != "/proc/config.gz" {
		t.Errorf("with /proc/config.gz: %q from %q", v, where)
	}
	// One that is not gzip is skipped, not read as text.
	write(t, dir, "/proc/config.gz", "CONFIG_HZ=1000\n", false)
	if v, where := Lookup(open, "6.1.0-1", "CONFIG_HZ"); v != "250" || where != "/boot/config-6.1.0-1" {
		t.Errorf("with a /proc/config.gz that is not gzip: %q from %q", v, where)
	}
}

// TestRelease: the running kernel's release, as /proc names it too.
func TestRelease(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Skip(err)
	}
	if got, want := Release(), strings.TrimSpace(string(b)); got != want {
		t.Errorf("Release() = %q, /proc/sys/kernel/osrelease says %q", got, want)
	}
}
