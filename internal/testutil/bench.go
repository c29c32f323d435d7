package testutil

import "testing"

// BenchStream times query n of a synthetic record stream, run(n): first
// warmup queries untimed (past the correlator's cap of queries in flight,
// so every timed query also evicts the oldest, as on a node that busy),
// then one query per b.N. The timer is stopped when it returns.
func BenchStream(b *testing.B, warmup uint64, run func(n uint64)) {
	var n uint64
	for ; n < warmup; n++ {
		run(n)
	}
	b.ReportAllocs()
	for b.Loop() {
		run(n)
		n++
	}
	b.StopTimer()
}
