package probe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// rings are the per-CPU ring buffers of the events map (an array of maps,
// one ring per possible CPU) and their readers, drained together: a poll
// of every ring's fd (and an eventfd that wakes it for a flush or Close)
// says when any has records.
type rings struct {
	maps  []*ebpf.Map
	rds   []*ringbuf.Reader
	epfd  int
	wake  int // eventfd
	stage []staged
	// closed is set first by close, which then takes mu: the drain holds
	// mu while it reads, and checks closed after taking it.
	closed atomic.Bool
	mu     sync.Mutex
}

// staged is what was read from one ring and not yet handed on: records
// newer than the watermark wait for the other rings to be read past them.
type staged struct {
	buf   []byte
	ends  []int
	first int // index of the first record not handed on
	off   int // its offset in buf
}

// newRings creates the rings spec (the events map) asks for, one per
// index, and the events map that holds them.
func newRings(spec *ebpf.MapSpec) (*rings, *ebpf.Map, error) {
	n := int(spec.MaxEntries)
	r := &rings{epfd: -1, wake: -1}
	ok := false
	defer func() {
		if !ok {
			r.close()
		}
	}()
	outer := spec.Copy()
	outer.Contents = nil
	for cpu := range n {
		m, err := ebpf.NewMap(spec.InnerMap)
		if err != nil {
			return nil, nil, fmt.Errorf("creating CPU %d's ring buffer: %w", cpu, err)
		}
		r.maps = append(r.maps, m)
		outer.Contents = append(outer.Contents, ebpf.MapKV{Key: uint32(cpu), Value: m})
	}
	events, err := ebpf.NewMap(outer)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the events map: %w", err)
	}
	if r.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		events.Close()
		return nil, nil, fmt.Errorf("creating an epoll instance: %w", err)
	}
	if r.wake, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		events.Close()
		return nil, nil, fmt.Errorf("creating an eventfd: %w", err)
	}
	fds := []int{r.wake}
	for _, m := range r.maps {
		rd, err := ringbuf.NewReader(m)
		if err != nil {
			events.Close()
			return nil, nil, fmt.Errorf("opening a ring buffer reader: %w", err)
		}
		r.rds = append(r.rds, rd)
		fds = append(fds, m.FD())
	}
	for _, fd := range fds {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
		if err := unix.EpollCtl(r.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			events.Close()
			return nil, nil, fmt.Errorf("polling a ring buffer: %w", err)
		}
	}
	r.stage = make([]staged, n)
	for i := range r.stage {
		r.stage[i] = staged{buf: make([]byte, 0, stageBytes), ends: make([]int, 0, stageBytes/64)}
	}
	ok = true
	return r, events, nil
}

// wait blocks until a ring may have records, wakeUp was called, or d
// passed; false when d passed.
func (r *rings) wait(d time.Duration) (bool, error) {
	var evs [1]unix.EpollEvent
	for {
		n, err := unix.EpollWait(r.epfd, evs[:], int(d/time.Millisecond))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("waiting for the ring buffers: %w", err)
		}
		if n > 0 && int(evs[0].Fd) == r.wake {
			var b [8]byte
			_, _ = unix.Read(r.wake, b[:])
		}
		return n > 0, nil
	}
}

// wakeUp makes a wait return.
func (r *rings) wakeUp() {
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], 1)
	_, _ = unix.Write(r.wake, b[:])
}

// stageBytes is how much a stage takes from its ring at a time: a ring
// holding more is read again once the stages are handed on.
const stageBytes = 256 << 10

// read copies the records ring i holds now into its stage, up to
// stageBytes; cut: the ring holds more. closed is set once the reader is
// closed.
func (r *rings) read(i int, rec *ringbuf.Record) (cut, closed bool, err error) {
	rd := r.rds[i]
	if rd.AvailableBytes() == 0 {
		return false, false, nil
	}
	s := &r.stage[i]
	// A deadline already passed: ReadInto returns what the ring holds,
	// then ErrDeadlineExceeded, without blocking.
	rd.SetDeadline(time.Unix(1, 0))
	for {
		if len(s.buf) >= stageBytes-recordRoom {
			return true, false, nil
		}
		err := rd.ReadInto(rec)
		switch {
		case err == nil:
			s.buf = append(s.buf, rec.RawSample...)
			s.ends = append(s.ends, len(s.buf))
			continue
		case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, ringbuf.ErrFlushed):
			return false, false, nil
		case errors.Is(err, ringbuf.ErrClosed):
			return false, true, nil
		}
		return false, false, fmt.Errorf("reading the ring buffer: %w", err)
	}
}

// next returns the oldest staged record (by its header's timestamp, each
// ring's own order kept) no newer than watermark, or nil.
func (r *rings) next(watermark uint64) []byte {
	best, bestTS := -1, uint64(0)
	for i := range r.stage {
		s := &r.stage[i]
		if s.first >= len(s.ends) {
			continue
		}
		ts := recordTS(s.buf[s.off:s.ends[s.first]])
		if ts <= watermark && (best < 0 || ts < bestTS) {
			best, bestTS = i, ts
		}
	}
	if best < 0 {
		return nil
	}
	s := &r.stage[best]
	rec := s.buf[s.off:s.ends[s.first]]
	s.off = s.ends[s.first]
	s.first++
	return rec
}

// compact drops the records handed on from every stage.
func (r *rings) compact() {
	for i := range r.stage {
		s := &r.stage[i]
		if s.first == 0 {
			continue
		}
		n := copy(s.buf, s.buf[s.off:])
		s.buf = s.buf[:n]
		k := copy(s.ends, s.ends[s.first:])
		s.ends = s.ends[:k]
		for j := range s.ends {
			s.ends[j] -= s.off
		}
		s.first, s.off = 0, 0
	}
}

// lastTS is the timestamp of the last record staged from ring i.
func (r *rings) lastTS(i int) uint64 {
	s := &r.stage[i]
	if len(s.ends) == 0 {
		return 0
	}
	start := 0
	if len(s.ends) > 1 {
		start = s.ends[len(s.ends)-2]
	}
	return recordTS(s.buf[start:])
}

// pending reports whether a stage holds records.
func (r *rings) pending() bool {
	for i := range r.stage {
		if r.stage[i].first < len(r.stage[i].ends) {
			return true
		}
	}
	return false
}

// availableBytes is what the rings hold.
func (r *rings) availableBytes() int {
	n := 0
	for _, rd := range r.rds {
		n += rd.AvailableBytes()
	}
	return n
}

func (r *rings) close() error {
	r.closed.Store(true)
	var errs []error
	if r.wake >= 0 {
		r.wakeUp()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rd := range r.rds {
		errs = append(errs, rd.Close())
	}
	for _, m := range r.maps {
		errs = append(errs, m.Close())
	}
	r.rds, r.maps = nil, nil
	// A wait still running was woken above; one that starts now fails and
	// sees closed.
	for _, fd := range []int{r.epfd, r.wake} {
		if fd >= 0 {
			errs = append(errs, unix.Close(fd))
		}
	}
	return errors.Join(errs...)
}

// recordTS is a record's header timestamp (bpf_ktime_get_ns: CLOCK_MONOTONIC).
func recordTS(rec []byte) uint64 {
	if len(rec) < 8 {
		return 0
	}
	return binary.NativeEndian.Uint64(rec)
}

// monotonicNow is CLOCK_MONOTONIC in nanoseconds, the records' clock.
func monotonicNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}
