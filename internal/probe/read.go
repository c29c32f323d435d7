package probe

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/dnsrace/dnsrace/internal/event"
)

// IdleEvery is how often Read calls its idle function while the ring
// buffer is empty, and so the longest a record waits in the ring: the
// kernel side wakes the reader only once a good part of the ring is full.
const IdleEvery = 100 * time.Millisecond

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
	if t.rd == nil {
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
		// Counted once a batch: an atomic add per record cost as much as
		// a record's decode.
		start, malformed := 0, uint64(0)
		for _, end := range b.ends {
			raw := b.buf[start:end]
			start = end
			if err := event.Decode(raw, &t.ev); err != nil {
				malformed++
				continue
			}
			fn(&t.ev)
		}
		t.bytes.Add(uint64(len(b.buf)))
		if malformed > 0 {
			t.malformed.Add(malformed)
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

// drain copies records from the ring into batches and hands them to full,
// which it closes when it returns: when ctx is done (after the records
// still in the ring), when the Tracer is closed, or on an error.
func (t *Tracer) drain(ctx context.Context, full chan<- *batch, free <-chan *batch) error {
	defer close(full)
	if t.nice != 0 {
		restore, err := NiceThread(t.nice)
		if err != nil {
			return fmt.Errorf("setting the ring drain's nice value to %d: %w", t.nice, err)
		}
		defer restore()
	}
	// ctx done: Flush wakes a blocked ReadInto, which returns the records
	// still in the ring and then ErrFlushed.
	stop := context.AfterFunc(ctx, func() { t.rd.Flush() })
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
	// The deadline is only ever set here, between reads, so SetDeadline
	// (which takes the reader's lock) never waits for a blocked read.
	t.rd.SetDeadline(time.Now().Add(IdleEvery))
	for {
		if err := t.rd.ReadInto(&t.rec); err != nil {
			switch {
			case errors.Is(err, ringbuf.ErrClosed):
				return nil
			case errors.Is(err, ringbuf.ErrFlushed):
				if ctx.Err() != nil {
					return nil
				}
				continue
			case errors.Is(err, os.ErrDeadlineExceeded):
				hand(true)
				t.rd.SetDeadline(time.Now().Add(IdleEvery))
				continue
			}
			return fmt.Errorf("reading the ring buffer: %w", err)
		}
		b.add(t.rec.RawSample)
		// What was copied goes to the caller before a read that may
		// block (the ring was empty as of this read: Remaining, from the
		// read's own look at the ring, not another per record): a batch
		// never waits for the ring to fill again.
		if b.full() || t.rec.Remaining == 0 {
			hand(false)
		}
	}
}
