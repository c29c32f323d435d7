package podinfo

import (
	"testing"
	"time"
)

// TestCachesForgetGonePods: a tracer runs for weeks on a node where pods
// come and go; answers about namespaces, processes and cgroups that are no
// longer asked about must not pile up.
func TestCachesForgetGonePods(t *testing.T) {
	now := time.Unix(1e9, 0)
	r := New(Config{ProcRoot: t.TempDir(), Root: t.TempDir(), TTL: time.Second})
	r.now = func() time.Time { return now }
	for ns := uint32(1); ns <= 100; ns++ {
		r.Lookup(ns, 0, 0)
	}
	if n := len(r.byNetNS); n != 100 {
		t.Fatalf("%d namespaces cached, want 100", n)
	}
	now = now.Add(sweepAfter * time.Second)
	r.Lookup(1000, 0, 0)
	if n := len(r.byNetNS); n != 1 {
		t.Errorf("%d namespaces cached after %d TTLs, want only the one asked since", n, sweepAfter)
	}
}
