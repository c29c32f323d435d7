package correlate

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// TestSocketListsMatchSlices pushes queries on a few sockets and removes
// them in random order (oldest, newest, from the middle), comparing every
// socket's list with a plain slice after each step: the table holds a
// socket exactly while it has a query, its head is the newest, and the
// walks see the newest sockRecentLen, newest first.
func TestSocketListsMatchSlices(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	ix := newIndex()
	dst := netip.MustParseAddrPort("10.96.0.10:53")
	const sockets = 5
	want := make([][]*query, sockets) // oldest first
	src := func(s int) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, 1}), uint16(40000+s))
	}
	for step := range 100000 {
		s := r.IntN(sockets)
		if len(want[s]) == 0 || r.IntN(100) < 52 {
			q := &query{qid: uint64(step) + 1, src: src(s), dst: dst}
			q.sock = sockOf(q.src, q.dst)
			ix.pushOnSocket(q)
			want[s] = append(want[s], q)
		} else {
			i := len(want[s]) - 1 // newest
			switch r.IntN(3) {
			case 0:
				i = 0
			case 1:
				i = r.IntN(len(want[s]))
			}
			ix.removeFromSocket(want[s][i])
			want[s] = slices.Delete(want[s], i, i+1)
		}
		inTable := 0
		for s, qs := range want {
			head := ix.sockets(src(s), dst)
			if len(qs) == 0 {
				if head != nil {
					t.Fatalf("step %d: socket %d has no query, its list starts at %d", step, s, head.qid)
				}
				continue
			}
			inTable++
			got, n := recentOnSocket(head)
			newest := slices.Clone(qs[max(0, len(qs)-sockRecentLen):])
			slices.Reverse(newest)
			if !slices.Equal(got[:n], newest) {
				t.Fatalf("step %d: socket %d lists %v, want %v", step, s, qids(got[:n]), qids(newest))
			}
			if q := ix.onSocket(src(s), dst); q != qs[len(qs)-1] {
				t.Fatalf("step %d: socket %d's newest is %v, want %d", step, s, q, qs[len(qs)-1].qid)
			}
		}
		if ix.socks.len() != inTable {
			t.Fatalf("step %d: %d sockets in the table, want %d", step, ix.socks.len(), inTable)
		}
	}
}

func qids(qs []*query) []uint64 {
	var ids []uint64
	for _, q := range qs {
		ids = append(ids, q.qid)
	}
	return ids
}
