package correlate

// fifo is a first-in first-out log: the queries in flight by first
// sighting, the stalls in progress by opening. The slots taken off the
// front are reused in place, so a steady stream (one in, the oldest out)
// allocates nothing: re-slicing the front away made append copy the whole
// log to a new array every few thousand queries, and that garbage kept the
// GC and its write barriers running on the read path.
type fifo[T any] struct {
	s    []T
	head int // s[:head] were taken off the front (zeroed)
}

func (l *fifo[T]) push(v T) {
	if len(l.s) == cap(l.s) && l.head >= len(l.s)/2 {
		n := copy(l.s, l.s[l.head:])
		clear(l.s[n:])
		l.s, l.head = l.s[:n], 0
	}
	l.s = append(l.s, v)
}

// live is the log, oldest first; valid until the next push.
func (l *fifo[T]) live() []T { return l.s[l.head:] }

func (l *fifo[T]) len() int { return len(l.s) - l.head }

// pop takes the oldest off the log.
func (l *fifo[T]) pop() T {
	v := l.s[l.head]
	var zero T
	l.s[l.head] = zero
	l.head++
	return v
}

// front is the oldest; the log must not be empty.
func (l *fifo[T]) front() T { return l.s[l.head] }

// compact gives memory back after a burst. It leaves room for as many
// again: cut to the exact size, a log that holds steady (a tick takes
// its front, pushes refill it) was copied to a larger array at every
// tick.
func (l *fifo[T]) compact() {
	if n := l.len(); cap(l.s) > 1024 && cap(l.s) > 4*n {
		s := make([]T, n, 2*n)
		copy(s, l.live())
		l.s, l.head = s, 0
	}
}

// keep drops every entry keep says no to, in order.
func (l *fifo[T]) keep(keep func(T) bool) {
	n := 0
	for _, v := range l.live() {
		if keep(v) {
			l.s[n] = v
			n++
		}
	}
	clear(l.s[n:])
	l.s, l.head = l.s[:n], 0
}
