package vmtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The archive reads back with GNU cpio, an implementation of its own.
func TestCpioReadsBack(t *testing.T) {
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skip("no cpio on this host")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	os.WriteFile(filepath.Join(src, "sub", "data"), []byte("abc"), 0o644)
	file := filepath.Join(dir, "a.cpio")
	err := writeCpio(file, func(c *cpioWriter) {
		c.File("init", 0o755, []byte("#!/bin/sh\n"))
		c.File("/vmtest/suites", 0o644, []byte("probe . fentry\n"))
		c.Symlink("bin/sh", "busybox")
		c.Tree("vmtest/suites.d/probe/testdata", src)
	})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	os.Mkdir(out, 0o755)
	cmd := exec.Command("cpio", "-id", "--quiet", "-F", file)
	cmd.Dir = out
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cpio -i: %v: %s", err, b)
	}
	for name, want := range map[string]string{"init": "#!/bin/sh\n", "vmtest/suites": "probe . fentry\n", "vmtest/suites.d/probe/testdata/sub/data": "abc"} {
		if b, err := os.ReadFile(filepath.Join(out, name)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v", name, b, err)
		}
	}
	if st, err := os.Stat(filepath.Join(out, "init")); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("init mode: %v %v", st, err)
	}
	if l, err := os.Readlink(filepath.Join(out, "bin", "sh")); err != nil || l != "busybox" {
		t.Errorf("bin/sh -> %q, %v", l, err)
	}
}
