package testutil

import (
	"runtime"
	"testing"
)

// BenchStream times query n of a synthetic record stream, run(n): first
// warmup queries untimed (past the correlator's cap of queries in flight,
// so every timed query also evicts the oldest, as on a node that busy),
// then one query per b.N. The timer is stopped when it returns. Besides
// allocs/op, which the testing package rounds down (a stream that
// allocates once in ten queries shows 0), it reports allocs/query with
// the fraction.
func BenchStream(b *testing.B, warmup uint64, run func(n uint64)) {
	var n uint64
	for ; n < warmup; n++ {
		run(n)
	}
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for b.Loop() {
		run(n)
		n++
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(b.N), "allocs/query")
}
