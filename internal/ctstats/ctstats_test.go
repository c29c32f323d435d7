package ctstats

import (
	"os"
	"runtime"
	"testing"

	"github.com/dnsrace/dnsrace/internal/testutil"
)

func TestReadHost(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat("/proc/sys/net/netfilter/nf_conntrack_max"); err != nil {
		testutil.SkipOrFail(t, "nf_conntrack not loaded")
	}
	s, err := Read("")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.PerCPU) < runtime.NumCPU() {
		t.Errorf("%d per-CPU rows, want at least %d (one per possible CPU)", len(s.PerCPU), runtime.NumCPU())
	}
	if s.Max == 0 {
		t.Errorf("nf_conntrack_max read as 0")
	}
	var sum Counters
	for _, c := range s.PerCPU {
		sum.Add(c)
	}
	if sum != s.Total {
		t.Errorf("total %+v is not the sum of the rows %+v", s.Total, sum)
	}
}

func TestReadMissingNamespace(t *testing.T) {
	if _, err := Read("/nonexistent/netns"); err == nil {
		t.Fatal("no error for a missing namespace")
	}
}

func TestSub(t *testing.T) {
	a := Counters{InsertFailed: 5, Drop: 7, ClashResolve: 9}
	b := Counters{InsertFailed: 2, Drop: 7, ClashResolve: 1}
	if d := a.Sub(b); d != (Counters{InsertFailed: 3, ClashResolve: 8}) {
		t.Fatalf("%+v", d)
	}
}
