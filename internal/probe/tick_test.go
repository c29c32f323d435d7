package probe

import (
	"bufio"
	"compress/gzip"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/testutil"
)

func TestSnapRate(t *testing.T) {
	for _, c := range []struct {
		measured float64
		want     uint32
	}{
		{250, 250}, {239.6, 250}, {262, 250}, {290, 300}, {312, 300},
		{91, 100}, {109.9, 100}, {1004, 1000}, {128.2, 128}, {24.1, 24},
	} {
		got, err := snapRate(c.measured)
		if err != nil || got != c.want {
			t.Errorf("snapRate(%v) = %d, %v; want %d", c.measured, got, err, c.want)
		}
	}
	for _, bad := range []float64{0, -250, 3, 20000} {
		if got, err := snapRate(bad); err == nil {
			t.Errorf("snapRate(%v) = %d, want an error", bad, got)
		}
	}
}

// TestTickRateIsTheKernels measures HZ the way the loader does and checks
// it against the kernel's build config where one is readable.
func TestTickRateIsTheKernels(t *testing.T) {
	testutil.RequireRoot(t)
	got, err := TickRate()
	if err != nil {
		t.Fatal(err)
	}
	want, where := configHZ(t)
	if where == "" {
		t.Logf("measured HZ %d; no kernel config to check it against", got)
		if got != 100 && got != 250 && got != 300 && got != 1000 {
			t.Fatalf("measured HZ %d: not a rate x86 or arm64 kernels are built with", got)
		}
		return
	}
	if got != want {
		t.Fatalf("measured HZ %d, %s says %d", got, where, want)
	}
}

// configHZ reads CONFIG_HZ from /proc/config.gz or /boot/config-$(uname -r);
// where is "" when neither is there.
func configHZ(t *testing.T) (hz uint32, where string) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/proc/config.gz", "/boot/config-" + unix.ByteSliceToString(u.Release[:])} {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		defer f.Close()
		var r io.Reader = f
		if strings.HasSuffix(p, ".gz") {
			z, err := gzip.NewReader(f)
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			r = z
		}
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "CONFIG_HZ="); ok {
				n, err := strconv.ParseUint(v, 10, 32)
				if err != nil {
					t.Fatalf("%s: CONFIG_HZ=%s: %v", p, v, err)
				}
				return uint32(n), p
			}
		}
		t.Fatalf("%s has no CONFIG_HZ", p)
	}
	return 0, ""
}
