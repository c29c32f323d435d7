package correlate

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// checkTable compares t with the Go map it should equal, and checks that
// every key is reachable from its home slot without crossing a hole.
func checkTable(t *testing.T, tb *table[int], want map[uint64]int) {
	t.Helper()
	if tb.len() != len(want) {
		t.Fatalf("len %d, want %d", tb.len(), len(want))
	}
	for k, v := range want {
		if got, ok := tb.get(k); !ok || got != v {
			t.Fatalf("get(%d) = %d,%v, want %d", k, got, ok, v)
		}
	}
	for i, s := range tb.slots {
		if s.k == 0 {
			continue
		}
		for j := tb.slot(s.k); j != i; j = (j + 1) & tb.mask() {
			if tb.slots[j].k == 0 {
				t.Fatalf("key %d in slot %d is behind a hole at %d", s.k, i, j)
			}
		}
	}
}

// refOrAdd sets k to v through refOrAdd, checking the value it finds: the
// old one, or zero for a new key.
func refOrAdd(t *testing.T, tb *table[int], want map[uint64]int, k uint64, v int) {
	t.Helper()
	p := tb.refOrAdd(k)
	if *p != want[k] {
		t.Fatalf("refOrAdd(%d) found %d, want %d", k, *p, want[k])
	}
	*p = v
	want[k] = v
}

// TestTableAgainstMap runs random sets, refOrAdds, gets, deletes and shrinks on a
// table and a Go map side by side, with clustered keys (sequential ids, as
// query ids are) and random ones.
func TestTableAgainstMap(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		r := rand.New(rand.NewPCG(seed, seed))
		tb, want := newTable[int](), map[uint64]int{}
		for i := range 200000 {
			k := uint64(r.IntN(5000)) + 1
			if i%2 == 0 {
				k = r.Uint64() | 1
			}
			switch r.IntN(4) {
			case 0:
				tb.set(k, i)
				want[k] = i
			case 1:
				refOrAdd(t, &tb, want, k, i)
			case 2:
				tb.del(k)
				delete(want, k)
			case 3:
				if v, ok := tb.get(k); ok != (want[k] == v && ok) {
					t.Fatalf("get(%d) = %d,%v; map has %d", k, v, ok, want[k])
				}
			}
			if i%50000 == 0 {
				checkTable(t, &tb, want)
				for k := range want {
					if r.IntN(10) > 0 {
						tb.del(k)
						delete(want, k)
					}
				}
				tb.shrink()
				checkTable(t, &tb, want)
			}
			if i%7919 == 0 {
				keepOnly(t, &tb, want, func(v int) bool { return v%3 != 0 })
			}
		}
		checkTable(t, &tb, want)
	}
}

// keepOnly runs tb.keepOnly(keep) and the same on want, and checks them.
func keepOnly(t *testing.T, tb *table[int], want map[uint64]int, keep func(int) bool) {
	t.Helper()
	tb.keepOnly(func(v *int) bool { return keep(*v) })
	for k, v := range want {
		if !keep(v) {
			delete(want, k)
		}
	}
	checkTable(t, tb, want)
	if 4*tb.len() > len(tb.slots) {
		t.Fatalf("after keepOnly %d entries fill more than a quarter of %d slots", tb.len(), len(tb.slots))
	}
}

// FuzzTable drives a table with an operation stream from the fuzzer.
func FuzzTable(f *testing.F) {
	f.Add([]byte{0, 1, 0, 2, 2, 1, 1, 2})
	f.Add([]byte{0, 5, 0, 5, 2, 5, 2, 5, 3, 5})
	f.Fuzz(func(t *testing.T, ops []byte) {
		tb, want := newTable[int](), map[uint64]int{}
		for i := 0; i+1 < len(ops); i += 2 {
			k := uint64(ops[i+1]%64)*0x1000 + 1 // collide in home slots
			if i+9 < len(ops) && ops[i]&0x80 != 0 {
				k = binary.LittleEndian.Uint64(ops[i+1:]) | 1
			}
			switch ops[i] % 4 {
			case 0:
				tb.set(k, i)
				want[k] = i
			case 1:
				refOrAdd(t, &tb, want, k, i)
			case 2:
				tb.del(k)
				delete(want, k)
			case 3:
				if ops[i]&0x40 != 0 {
					keepOnly(t, &tb, want, func(v int) bool { return v%4 < 2 })
				} else {
					tb.shrink()
				}
			}
		}
		checkTable(t, &tb, want)
	})
}
