package correlate

import (
	"math/rand/v2"
	"testing"
)

// TestFifoMatchesSlice drives the ring and a plain slice with the same
// random pushes, pops, keeps and compactions (across wraparounds and
// growth while wrapped) and compares them after every step.
func TestFifoMatchesSlice(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var l fifo[int]
	var want []int
	next := 0
	for step := range 200000 {
		switch op := r.IntN(100); {
		case op < 55:
			for range r.IntN(8) + 1 {
				l.push(next)
				want = append(want, next)
				next++
			}
		case op < 97:
			for range r.IntN(10) + 1 {
				if len(want) == 0 {
					break
				}
				if got := l.pop(); got != want[0] {
					t.Fatalf("step %d: pop %d, want %d", step, got, want[0])
				}
				want = want[1:]
			}
		case op < 98:
			odd := func(v int) bool { return v%3 != 0 }
			l.keep(odd)
			kept := want[:0:0]
			for _, v := range want {
				if odd(v) {
					kept = append(kept, v)
				}
			}
			want = kept
		default:
			l.compact()
		}
		if l.len() != len(want) {
			t.Fatalf("step %d: len %d, want %d", step, l.len(), len(want))
		}
		if len(want) > 0 && (l.front() != want[0] || *l.at(len(want) - 1) != want[len(want)-1]) {
			t.Fatalf("step %d: front %d back %d, want %d %d", step, l.front(), *l.at(len(want) - 1), want[0], want[len(want)-1])
		}
	}
	for i, v := range want {
		if *l.at(i) != v {
			t.Fatalf("entry %d = %d, want %d", i, *l.at(i), v)
		}
	}
}

// TestFifoSteadyStreamNoAlloc: one in, one out, at a steady depth, never
// allocates once the ring has grown to it.
func TestFifoSteadyStreamNoAlloc(t *testing.T) {
	var l fifo[pendingDrop]
	for i := range 5000 {
		l.push(pendingDrop{qid: uint64(i)})
	}
	n := uint64(5000)
	allocs := testing.AllocsPerRun(10000, func() {
		l.push(pendingDrop{qid: n})
		n++
		l.pop()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per push and pop at a steady depth", allocs)
	}
}
