package correlate

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// TestSocketListsMatchSlices adds queries on a few sockets, many of them
// on a socket or two (a flood's) and the rest on sockets used once (a
// resolver's new port per lookup), and forgets the oldest now and then as
// expiry and the cap do, comparing every socket's list with a plain slice
// after each step: the newest sockRecentLen in flight, newest first, and no
// query the order log has passed. The table must not keep the entries of
// sockets with nothing in flight beyond its sweeps.
func TestSocketListsMatchSlices(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	ix := newIndex()
	dst := netip.MustParseAddrPort("10.96.0.10:53")
	src := func(s int) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(s >> 8), 1}), uint16(40000+s))
	}
	want := map[int][]*query{} // oldest first
	var order []int            // the socket of every query in flight, oldest first
	maxEntries, maxLive := 0, 0
	for step := range 200000 {
		if len(order) == 0 || r.IntN(100) < 51 {
			s := r.IntN(3) // a hot socket
			if r.IntN(2) == 0 {
				s = 3 + step // used once
			}
			q := ix.alloc()
			*q = query{qid: uint64(step) + 1, src: src(s % 60000), dst: dst}
			q.sock = sockOf(q.src, q.dst)
			ix.add(q)
			want[s%60000] = append(want[s%60000], q)
			order = append(order, s%60000)
		} else {
			q := ix.popOldest()
			s := order[0]
			order = order[1:]
			if want[s][0] != q {
				t.Fatalf("step %d: popped %d, want %d", step, q.qid, want[s][0].qid)
			}
			ix.forget(q)
			if want[s] = want[s][1:]; len(want[s]) == 0 {
				delete(want, s)
			}
		}
		maxEntries, maxLive = max(maxEntries, ix.socks.len()), max(maxLive, len(want))
		if step%997 != 0 && step > 1000 {
			continue
		}
		for s, qs := range want {
			got, n := ix.recentOnSocket(ix.sockets(src(s), dst))
			newest := slices.Clone(qs[max(0, len(qs)-sockRecentLen):])
			slices.Reverse(newest)
			if !slices.Equal(got[:n], newest) {
				t.Fatalf("step %d: socket %d lists %v, want %v", step, s, qids(got[:n]), qids(newest))
			}
			if q := ix.onSocket(src(s), dst); q != qs[len(qs)-1] {
				t.Fatalf("step %d: socket %d's newest is %v, want %d", step, s, q, qs[len(qs)-1].qid)
			}
		}
		for range 100 {
			if s := r.IntN(min(step+4, 60000)); want[s] == nil && ix.sockets(src(s), dst) != nil {
				t.Fatalf("step %d: socket %d has no query in flight, its list starts at %d", step, s, ix.sockets(src(s), dst).qid)
			}
		}
	}
	// A sweep leaves the table at most a quarter full, its size the power
	// of two at or above four times the sockets in flight, and the next
	// comes at half full: never more than four entries per socket in
	// flight (or half the smallest table).
	if maxEntries > max(4*maxLive, 1<<tableMinBits/2) {
		t.Errorf("the socket table reached %d entries with at most %d sockets in flight: not swept", maxEntries, maxLive)
	}
}

func qids(qs []*query) []uint64 {
	var ids []uint64
	for _, q := range qs {
		ids = append(ids, q.qid)
	}
	return ids
}

// TestPromoteLinksOnlyPendingQueries: queries are answered, lost and
// forgotten (their structs reused for new queries) at random while time
// passes; after every promote a query is in its name's list exactly when
// it was still pending once MinRetryGap old (and not answered or forgotten
// since). A young ref left behind by a query answered or forgotten would
// link an answered query, or a new one in the reused struct before its
// time.
func TestPromoteLinksOnlyPendingQueries(t *testing.T) {
	const gap = 1000
	r := rand.New(rand.NewPCG(7, 8))
	ix := newIndex()
	var live []*query             // in flight, oldest first
	linked := map[*query]bool{}   // the model: in its name's list
	promoted := map[*query]bool{} // was pending when it came of age
	now := uint64(1)
	for step := range 50000 {
		switch k := r.IntN(10); {
		case k < 3 || len(live) == 0:
			q := ix.alloc()
			*q = query{qid: uint64(step) + 1, sentNs: now, nk: nameOf(1, uint64(r.IntN(8)), 1)}
			ix.add(q)
			live = append(live, q)
			delete(linked, q)
			delete(promoted, q)
		case k < 6:
			if q := live[r.IntN(len(live))]; q.state == statePending {
				ix.setState(q, stateAnswered)
				ix.unpend(q)
				delete(linked, q)
			}
		case k < 7:
			if q := live[r.IntN(len(live))]; q.state == statePending {
				ix.setState(q, stateLost) // stays linked until a walk
			}
		default:
			q := ix.popOldest()
			if q != live[0] {
				t.Fatalf("step %d: popped %d, want %d", step, q.qid, live[0].qid)
			}
			live = live[1:]
			delete(linked, q)
			ix.forget(q)
		}
		now += uint64(r.IntN(40))
		ix.promote(now, gap)
		for _, q := range live {
			if q.state == statePending && q.sentNs+gap <= now && !promoted[q] {
				promoted[q], linked[q] = true, true
			}
			if q.inPend != linked[q] {
				t.Fatalf("step %d: query %d (state %d, sent %d, now %d) linked %v, want %v",
					step, q.qid, q.state, q.sentNs, now, q.inPend, linked[q])
			}
		}
	}
}
