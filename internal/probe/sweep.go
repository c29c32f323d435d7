package probe

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"

	"github.com/dnsrace/dnsrace/internal/bpf"
)

// The flow table (flows, and answers where NAT rewrites answers in the
// asking namespace) is a plain hash map: the programs insert a query's
// entry and delete it at its answer, and nothing else ever deletes the
// entries of queries never answered. The sweeper does, on a timer: an
// entry last seen longer ago than any answer can come (FlowMaxAge) is
// swept. A table past sweepHigh full, with queries lost faster than they
// age out, has its oldest entries evicted down to sweepLow, counted:
// their late answers, if any, are not matched, and each such query is
// reported untracked (event.KindUntracked). Between sweeps a burst can
// still fill it; the programs then refuse new entries and say so
// (STAT_FLOWS_REFUSED, and the query untracked).
//
// The walk is a BPF program run on demand (bpf/lib/sweep.h), which reports
// the evicted queries in the ring itself: a map syscall holds the CPU's
// bpf_prog_active while it works, and a kprobe program that fires on that
// CPU meanwhile is skipped; where the kernel preempts kernel code, for as
// long as the sweeping thread waits to run again. Kernels without
// bpf_for_each_map_elem (before 5.13) are walked with batch syscalls.

const (
	// DefaultFlowMaxAge outlives the correlator's QueryTTL (12 s), after
	// which an unanswered query is lost whatever comes.
	DefaultFlowMaxAge = 15 * time.Second
	// sweepEvery is the sweeper's period; sweepBusy its period while the
	// table is more than sweepLow full.
	sweepEvery = time.Second
	sweepBusy  = 100 * time.Millisecond
	// sweepHigh and sweepLow are fractions of the table's size.
	sweepHigh = 0.75
	sweepLow  = 0.5
	// sweepBatch is how many entries one batch call reads.
	sweepBatch = 1024
)

// sweeper removes the flow table's entries nobody will delete.
type sweeper struct {
	// j reads jiffies from user space for a walk with map syscalls (no
	// sweep program); nil with the program, which reads them itself
	j      *jiffies
	hz     uint32
	maxAge uint32 // in jiffies
	tables []sweepTable

	swept, evicted atomic.Uint64
	// runs counts the periodic sweeps done: tests wait in sweeps, which
	// take seconds under emulation, not in seconds
	runs atomic.Uint64

	// The queries whose flows were evicted, until Read reports them.
	mu      sync.Mutex
	young   []uint64
	pending atomic.Bool

	cancel context.CancelFunc
	done   sync.WaitGroup
}

// sweepTable is one map the sweeper looks after.
type sweepTable interface {
	// sweep deletes the entries older than maxAge jiffies at now, then,
	// past sweepHigh full, the oldest down to sweepLow, appending their
	// queries to evicted; it returns how many it swept and evicted and
	// how full it left the table.
	sweep(now, maxAge uint32, evicted *[]uint64) (swept, nEvicted int, full float64, err error)
}

// startSweeper sweeps flows and answers every sweepEvery until stop, with
// prog (the sweep_flows program) where the kernel loaded it, else with map
// syscalls.
func startSweeper(prog *ebpf.Program, flows, answers *ebpf.Map, hz uint32, maxAge time.Duration) (*sweeper, error) {
	if maxAge <= 0 {
		maxAge = DefaultFlowMaxAge
	}
	s := &sweeper{hz: hz, maxAge: uint32(maxAge.Seconds() * float64(hz))}
	if prog != nil {
		s.tables = []sweepTable{
			&progTable{prog: prog, table: bpf.DnsraceSweepTableSWEEP_FLOWS, size: int(flows.MaxEntries())},
			&progTable{prog: prog, table: bpf.DnsraceSweepTableSWEEP_ANSWERS, size: int(answers.MaxEntries())},
		}
	} else {
		var err error
		if s.j, err = newJiffies(); err != nil {
			return nil, err
		}
		if flows != nil {
			s.tables = append(s.tables, &table[bpf.DnsraceFlowKey, bpf.DnsraceFlow]{m: flows,
				ts: func(v *bpf.DnsraceFlow) (uint64, uint64) { return v.Ts, v.Qid }})
		}
		if answers != nil {
			s.tables = append(s.tables, &table[bpf.DnsraceAnsKey, bpf.DnsraceAns]{m: answers,
				ts: func(v *bpf.DnsraceAns) (uint64, uint64) { return v.Ts, v.Qid }})
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.done.Add(1)
	go s.run(ctx)
	return s, nil
}

func (s *sweeper) run(ctx context.Context) {
	defer s.done.Done()
	wait := sweepEvery
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		full, err := s.once()
		if err != nil {
			// A map that cannot be read now (the tracer closing) is
			// tried again at the next period.
			full = 0
		}
		s.runs.Add(1)
		wait = sweepEvery
		if full > sweepLow {
			wait = sweepBusy
		}
	}
}

// once sweeps every table once; it returns the fullest table's fill.
func (s *sweeper) once() (float64, error) {
	var now uint32
	if s.j != nil {
		var err error
		if now, _, err = s.j.read(); err != nil {
			return 0, err
		}
	}
	var fullest float64
	var errs []error
	var evicted []uint64
	for _, t := range s.tables {
		swept, n, full, err := t.sweep(now, s.maxAge, &evicted)
		s.swept.Add(uint64(swept))
		s.evicted.Add(uint64(n))
		fullest = max(fullest, full)
		errs = append(errs, err)
	}
	if len(evicted) > 0 {
		s.mu.Lock()
		s.young = append(s.young, evicted...)
		s.mu.Unlock()
		s.pending.Store(true)
	}
	return fullest, errors.Join(errs...)
}

// takeEvicted returns the queries whose flows were evicted since its last
// call.
func (s *sweeper) takeEvicted() []uint64 {
	if !s.pending.Load() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.young
	s.young = nil
	s.pending.Store(false)
	return q
}

// stop ends the sweeps and waits for the one running.
func (s *sweeper) stop() {
	s.cancel()
	s.done.Wait()
	if s.j != nil {
		s.j.Close()
	}
}

// table is a hash map of keys K and values V whose ts says, in jiffies,
// when the entry was last seen, and for which query.
type table[K comparable, V any] struct {
	m    *ebpf.Map
	ts   func(*V) (jiffies, qid uint64)
	keys []K
	vals []V
	old  []K
	all  []aged[K]
}

type aged[K any] struct {
	k   K
	age uint32
	qid uint64
}

func (t *table[K, V]) sweep(now, maxAge uint32, evicted *[]uint64) (swept, nEvicted int, full float64, err error) {
	if t.keys == nil {
		t.keys, t.vals = make([]K, sweepBatch), make([]V, sweepBatch)
	}
	t.old, t.all = t.old[:0], t.all[:0]
	var c ebpf.MapBatchCursor
	for {
		n, err := t.m.BatchLookup(&c, t.keys, t.vals, nil)
		for i := range n {
			// The difference of the low halves is the age, wrapped
			// or not; an entry made after now (on another CPU, during
			// the walk) is younger than 0, not 49 days old.
			ts, qid := t.ts(&t.vals[i])
			age := uint32(max(int32(now-uint32(ts)), 0))
			if age > maxAge {
				t.old = append(t.old, t.keys[i])
			} else {
				t.all = append(t.all, aged[K]{t.keys[i], age, qid})
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return 0, 0, 0, err
		}
	}
	swept = t.delete(t.old, nil)
	size := int(t.m.MaxEntries())
	left := len(t.all)
	if float64(left) > sweepHigh*float64(size) {
		slices.SortFunc(t.all, func(a, b aged[K]) int { return cmp.Compare(b.age, a.age) })
		t.old = t.old[:0]
		young := t.all[:left-int(sweepLow*float64(size))]
		for _, e := range young {
			t.old = append(t.old, e.k)
		}
		// A key gone meanwhile was answered: not evicted.
		nEvicted = t.delete(t.old, func(i int) { *evicted = append(*evicted, young[i].qid) })
		left -= nEvicted
	}
	return swept, nEvicted, float64(left) / float64(size), nil
}

// delete deletes keys, skipping those gone meanwhile (answered), calls
// deleted (when not nil) with the index of each key it deleted, and
// returns how many it deleted. A key answered and asked again with the
// same socket and id between the lookup and the delete (a resend, more
// than the table's age after the last one) would go with it: its answer
// is then not matched.
func (t *table[K, V]) delete(keys []K, deleted func(i int)) int {
	count, base := 0, 0
	done := func(from, to int) {
		count += to - from
		if deleted != nil {
			for i := from; i < to; i++ {
				deleted(base + i)
			}
		}
	}
	for len(keys) > 0 {
		n, err := t.m.BatchDelete(keys, nil)
		done(0, n)
		if err == nil || n >= len(keys) {
			break
		}
		// The batch stops at the first key it could not delete: gone
		// meanwhile, or a kernel without batch deletes (one at a time).
		if !errors.Is(err, ebpf.ErrKeyNotExist) && t.m.Delete(keys[n]) == nil {
			done(n, n+1)
		}
		keys, base = keys[n+1:], base+n+1
	}
	return count
}

// progTable is a table the sweep_flows program walks.
type progTable struct {
	prog    *ebpf.Program
	table   bpf.DnsraceSweepTable
	size    int
	in, out []byte
}

// sweep runs the program once, and, past sweepHigh full, again to evict
// the oldest entries down to sweepLow. The program bins the entries it
// keeps by age; the eviction takes the bins beyond the one where the count
// is reached, and the rest from that bin, whichever it meets first. The
// evicted queries reach the ring as EV_UNTRACKED records, not evicted.
func (t *progTable) sweep(_, maxAge uint32, _ *[]uint64) (swept, nEvicted int, full float64, err error) {
	io, err := t.run(bpf.DnsraceSweepIo{MaxAge: maxAge})
	if err != nil {
		return 0, 0, 0, err
	}
	swept, left := int(io.Swept), int(io.Left)
	if float64(left) > sweepHigh*float64(t.size) {
		in := evictOldest(io.Hist[:], left-int(sweepLow*float64(t.size)), maxAge)
		in.Now = io.Now // the ages the bins were made of
		if io, err = t.run(in); err != nil {
			return swept, 0, 0, err
		}
		swept, nEvicted, left = swept+int(io.Swept), int(io.Evicted), int(io.Left)
	}
	return swept, nEvicted, float64(left) / float64(t.size), nil
}

// flowsLive counts the flow table's entries with one run of the sweep
// program that deletes none (no age exceeds the largest); false where the
// table is swept with syscalls. Safe beside the sweeper's own runs.
func (s *sweeper) flowsLive() (uint64, bool) {
	if len(s.tables) == 0 {
		return 0, false
	}
	flows, ok := s.tables[0].(*progTable)
	if !ok {
		return 0, false
	}
	own := progTable{prog: flows.prog, table: flows.table, size: flows.size}
	io, err := own.run(bpf.DnsraceSweepIo{MaxAge: math.MaxUint32})
	if err != nil {
		return 0, false
	}
	return uint64(io.Left), true
}

func (t *progTable) run(io bpf.DnsraceSweepIo) (bpf.DnsraceSweepIo, error) {
	io.Table = uint32(t.table)
	size := binary.Size(io)
	if t.in == nil {
		t.in, t.out = make([]byte, size), make([]byte, size)
	}
	if _, err := binary.Encode(t.in, binary.NativeEndian, &io); err != nil {
		return io, err
	}
	ret, err := t.prog.Run(&ebpf.RunOptions{Data: t.in, DataOut: t.out})
	if err != nil {
		return io, fmt.Errorf("running the sweep program: %w", err)
	}
	if ret != xdpPass {
		return io, fmt.Errorf("the sweep program returned %d: its input was short", ret)
	}
	_, err = binary.Decode(t.out, binary.NativeEndian, &io)
	return io, err
}

// xdpPass is what the sweep program returns when it ran.
const xdpPass = 2

// evictOldest is the sweep's input that evicts the n oldest of the entries
// binned in hist (bin i holds the ages a with a*len(hist)/(maxAge+1) = i):
// every entry of the bins older than the one where the count reaches n,
// and the rest of n from that bin.
func evictOldest(hist []uint32, n int, maxAge uint32) bpf.DnsraceSweepIo {
	io := bpf.DnsraceSweepIo{MaxAge: maxAge}
	bins := uint64(len(hist))
	edge := func(i int) uint32 { // the youngest age of bin i
		return uint32((uint64(i)*(uint64(maxAge)+1) + bins - 1) / bins)
	}
	older := 0
	for i := len(hist) - 1; i >= 0; i-- {
		if older+int(hist[i]) >= n {
			io.EvictAll, io.EvictFrom, io.EvictSome = edge(i+1), edge(i), uint32(n-older)
			return io
		}
		older += int(hist[i])
	}
	io.EvictAll, io.EvictFrom, io.EvictSome = edge(len(hist)), 0, uint32(older)
	return io
}
