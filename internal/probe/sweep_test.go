package probe

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/bpf"
	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

func TestEvictOldest(t *testing.T) {
	const maxAge = 639 // 64 bins of 10 jiffies
	hist := make([]uint32, 64)
	hist[63], hist[10], hist[9], hist[0] = 5, 20, 7, 100
	for _, c := range []struct {
		n                     int
		all, from, some, want uint32
	}{
		{n: 3, all: 640, from: 630, some: 3},    // within the oldest bin
		{n: 5, all: 640, from: 630, some: 5},    // exactly the oldest bin
		{n: 6, all: 110, from: 100, some: 1},    // one of bin 10 (bins 11-62 are empty)
		{n: 25, all: 110, from: 100, some: 20},  // all of bin 10 (the rest: none)
		{n: 30, all: 100, from: 90, some: 5},    // into bin 9
		{n: 40, all: 10, from: 0, some: 8},      // into bin 0
		{n: 1000, all: 640, from: 0, some: 132}, // more than there are: every entry
	} {
		io := evictOldest(hist, c.n, maxAge)
		if io.EvictAll != c.all || io.EvictFrom != c.from || io.EvictSome != c.some || io.MaxAge != maxAge {
			t.Errorf("n=%d: all %d from %d some %d, want %d %d %d", c.n, io.EvictAll, io.EvictFrom, io.EvictSome, c.all, c.from, c.some)
		}
	}
}

// TestSweepProgram holds the sweep program (bpf/lib/sweep.h) to its
// contract on this kernel: entries past maxAge swept, the oldest of the
// rest evicted down to sweepLow of the table, each evicted query reported
// once in the ring, and nothing else deleted.
func TestSweepProgram(t *testing.T) {
	tierIndependent(t)
	testutil.RequireRoot(t)
	requireBTF(t)
	const (
		entries = 1024
		stale   = 100 // older than maxAge
		fresh   = 800 // ages spread over half of maxAge
	)
	tr := openTier(t, Options{Attach: testTier(t), Ports: []uint16{53}, FlowEntries: entries, FlowMaxAge: time.Hour})
	if len(tr.sweeper.tables) == 0 {
		t.Fatal("no sweeper tables")
	}
	pt, ok := tr.sweeper.tables[0].(*progTable)
	if !ok {
		t.Skip("the kernel did not load the sweep program (bpf_for_each_map_elem: 5.13+): map syscalls sweep")
	}
	tr.sweeper.stop() // this test runs the sweeps
	j, err := newJiffies()
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	now, _, err := j.read()
	if err != nil {
		t.Fatal(err)
	}
	const maxAge = 6400
	m := tr.maps[bpf.DnsraceMapFlows]
	// Queries are numbered from 1<<40 (no real query's qid) by age: qid
	// 1<<40+i is i jiffies old, so the oldest have the largest.
	const base = 1 << 40
	ageOf := map[uint64]uint32{}
	put := func(i int, age uint32) {
		k := bpf.DnsraceFlowKey{Id: uint16(i), Family: 4, Sport: 4242}
		v := bpf.DnsraceFlow{Qid: base + uint64(age), Ts: uint64(now - age)}
		ageOf[v.Qid] = age
		if err := m.Put(&k, &v); err != nil {
			t.Fatal(err)
		}
	}
	for i := range stale {
		put(i, maxAge+1+uint32(i))
	}
	// the fresh over half of maxAge: the other half is for the time the
	// puts take in a slow guest, which ages them all before the sweep
	for i := range fresh {
		put(stale+i, uint32(i*maxAge/2/fresh))
	}

	// Counting the table (FlowsLive, a run that deletes nothing) sees
	// every entry and deletes none.
	if n := tr.FlowsLive(); n != stale+fresh {
		t.Errorf("FlowsLive() = %d before the sweep, want %d", n, stale+fresh)
	}

	var mu sync.Mutex
	reported := map[uint64]int{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- tr.Read(ctx, func(e *event.Event) {
			if e.Kind == event.KindUntracked && e.QID >= base {
				mu.Lock()
				reported[e.QID]++
				mu.Unlock()
			}
		}, nil)
	}()
	swept, evicted, full, err := pt.sweep(0, maxAge, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantEvicted := fresh - entries/2
	if swept != stale || evicted != wantEvicted || full != sweepLow {
		t.Errorf("swept %d, evicted %d, left %.2f full; want %d, %d, %.2f", swept, evicted, full, stale, wantEvicted, sweepLow)
	}
	if n := tr.FlowsLive(); n != entries/2 {
		t.Errorf("FlowsLive() = %d after the sweep, want %d", n, entries/2)
	}
	// The kept are younger than the evicted, within a bin.
	var youngestGone uint32 = maxAge
	kept := map[uint64]bool{}
	it := m.Iterate()
	var k bpf.DnsraceFlowKey
	var v bpf.DnsraceFlow
	for it.Next(&k, &v) {
		if v.Qid >= base {
			kept[v.Qid] = true
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(reported)
		mu.Unlock()
		if n >= wantEvicted || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	var oldestKept uint32
	for q := range kept {
		oldestKept = max(oldestKept, ageOf[q])
	}
	for q, n := range reported {
		if n != 1 || kept[q] || ageOf[q] > maxAge {
			t.Errorf("query aged %d reported evicted %d times (kept %v)", ageOf[q], n, kept[q])
		}
		youngestGone = min(youngestGone, ageOf[q])
	}
	if len(reported) != wantEvicted || len(kept) != entries/2 {
		t.Errorf("%d evicted queries reported, %d kept; want %d, %d", len(reported), len(kept), wantEvicted, entries/2)
	}
	if bin := uint32(maxAge / 64); oldestKept >= youngestGone+bin {
		t.Errorf("kept a query aged %d, evicted one aged %d: more than a bin (%d) apart", oldestKept, youngestGone, bin)
	}
}
