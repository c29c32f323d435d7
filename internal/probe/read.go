package probe

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/dnsrace/dnsrace/internal/event"
)

// IdleEvery is how often Read calls its idle function while the ring
// buffer is empty, and so the longest a record waits in the ring: the
// kernel side wakes the reader only once a good part of the ring is full.
const IdleEvery = 100 * time.Millisecond

// ringLag bounds the time from a record's timestamp to its commit to its
// CPU's ring (a program's run, which cannot sleep): a record is handed on
// only once every ring has been read that long after its timestamp.
const ringLag = 5 * time.Millisecond

// Records are drained from the ring into batches of up to batchRecords
// records or batchBytes bytes; readBatches of them may wait for the
// caller. A batch counts as full with recordRoom bytes still free: more
// than the largest record (a QUERY with its 272 bytes of DNS), so a
// record never makes a batch's buffer grow.
const (
	batchRecords = 1024
	batchBytes   = 128 << 10
	recordRoom   = 1024
	readBatches  = 16
)

// batch is records copied out of the ring, back to back.
type batch struct {
	buf  []byte
	ends []int // end of each record in buf
	// idle: the ring was empty for IdleEvery after these records.
	idle bool
}

func (b *batch) add(rec []byte) {
	b.buf = append(b.buf, rec...)
	b.ends = append(b.ends, len(b.buf))
}

func (b *batch) full() bool {
	return len(b.ends) >= batchRecords || len(b.buf) >= batchBytes-recordRoom
}

func (b *batch) reset() { b.buf, b.ends, b.idle = b.buf[:0], b.ends[:0], false }

// Read calls fn for each record until ctx is done or the Tracer is closed,
// then returns nil. fn gets the same *event.Event every time: it must copy
// what it keeps. Records that do not decode are counted (Malformed) and
// skipped. idle, if not nil, is called whenever the ring buffer has been
// empty for IdleEvery. fn and idle run on the calling goroutine, one at a
// time, so a caller can keep all its state there and never share a lock
// with it.
//
// The ring is drained on a goroutine of its own, into a few reused batches
// (Read allocates nothing per record): the kernel's records leave the ring
// at the rate a copy allows, and fn's work runs on another thread. When fn
// falls behind by every batch, the ring fills and the kernel counts what
// it could not put there (Lost), as before.
func (t *Tracer) Read(ctx context.Context, fn func(*event.Event), idle func()) error {
	t.readMu.Lock()
	defer t.readMu.Unlock()
	if t.rings == nil {
		return errors.New("tracer is closed")
	}
	if t.batches == nil {
		for range readBatches {
			t.batches = append(t.batches, &batch{buf: make([]byte, 0, batchBytes), ends: make([]int, 0, batchRecords)})
		}
	}
	full, free := make(chan *batch, readBatches), make(chan *batch, readBatches)
	for _, b := range t.batches {
		b.reset()
		free <- b
	}
	drained := make(chan error, 1)
	go func() { drained <- t.drain(ctx, full, free) }()
	for b := range full {
		start := 0
		for _, end := range b.ends {
			raw := b.buf[start:end]
			start = end
			t.bytes.Add(uint64(len(raw)))
			if err := event.Decode(raw, &t.ev); err != nil {
				t.malformed.Add(1)
				continue
			}
			fn(&t.ev)
		}
		if t.sweeper != nil {
			// Flows the sweeper evicted young: their queries' answers
			// will not be matched.
			for _, qid := range t.sweeper.takeEvicted() {
				t.ev = event.Event{Kind: event.KindUntracked, QID: qid}
				fn(&t.ev)
			}
		}
		if b.idle && idle != nil {
			idle()
		}
		b.reset()
		free <- b
	}
	return <-drained
}

// drain copies records from the rings into batches and hands them to full,
// which it closes when it returns: when ctx is done (after the records
// still in the rings), when the Tracer is closed, or on an error. Records
// of different CPUs are handed on in the order of their timestamps: a
// record is handed on once every ring has been read past it (read after
// its time plus ringLag), so a query's record always comes before its
// answer's, whichever CPUs they came from.
func (t *Tracer) drain(ctx context.Context, full chan<- *batch, free <-chan *batch) error {
	defer close(full)
	if t.nice != 0 {
		restore, err := NiceThread(t.nice)
		if err != nil {
			return fmt.Errorf("setting the ring drain's nice value to %d: %w", t.nice, err)
		}
		defer restore()
	}
	r := t.rings
	stop := context.AfterFunc(ctx, r.wakeUp)
	defer stop()
	b := <-free
	hand := func(idle bool) {
		b.idle = idle
		full <- b
		b = <-free
	}
	defer func() {
		if len(b.ends) > 0 {
			full <- b
		}
	}()
	// read reads every ring and hands on what is older than the
	// watermark; done: the Tracer is closed.
	// A ring read only in part (its stage full) holds records newer than
	// its last one read, and maybe older than the other rings' records:
	// those wait, and the rings are read again at once (more).
	read := func(watermark uint64) (done, more bool, n int, err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.closed.Load() {
			return true, false, 0, nil
		}
		for i := range r.rds {
			cut, closed, err := r.read(i, &t.rec)
			if closed || err != nil {
				return closed, false, 0, err
			}
			if cut {
				more = true
				watermark = min(watermark, r.lastTS(i))
			}
		}
		for rec := r.next(watermark); rec != nil; rec = r.next(watermark) {
			b.add(rec)
			n++
			if b.full() {
				hand(false)
			}
		}
		r.compact()
		return false, more, n, nil
	}
	idleSince := time.Now()
	for {
		ending := ctx.Err() != nil
		watermark := uint64(math.MaxUint64)
		if !ending {
			watermark = monotonicNow() - uint64(ringLag)
		}
		done, more, n, err := read(watermark)
		if done || err != nil {
			return err
		}
		if more {
			continue
		}
		if len(b.ends) > 0 {
			hand(false)
		}
		if ending {
			return nil
		}
		if n > 0 {
			idleSince = time.Now()
		}
		wait := IdleEvery - time.Since(idleSince)
		if r.pending() {
			wait = min(wait, ringLag)
		}
		if wait <= 0 {
			// Empty for IdleEvery.
			hand(true)
			idleSince = time.Now()
			continue
		}
		if _, err := r.wait(wait); err != nil {
			if r.closed.Load() {
				return nil
			}
			return err
		}
	}
}
