package probe

import (
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/dnsrace/dnsrace/internal/kconfig"
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
	tierIndependent(t)
	testutil.RequireRoot(t)
	got, err := TickRate()
	if err != nil {
		t.Fatal(err)
	}
	v, where := kconfig.Lookup(os.Open, kconfig.Release(), "CONFIG_HZ")
	if where == "" {
		t.Logf("measured HZ %d; no kernel config to check it against", got)
		if !slices.Contains(commonRates, float64(got)) {
			t.Fatalf("measured HZ %d: not a rate x86 or arm64 kernels are built with (%v)", got, commonRates)
		}
		return
	}
	want, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		t.Fatalf("%s: CONFIG_HZ=%s: %v", where, v, err)
	}
	if uint64(got) != want {
		t.Fatalf("measured HZ %d, %s says %d", got, where, want)
	}
}
