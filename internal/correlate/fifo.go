package correlate

// fifo is a first-in first-out log: the queries in flight by first
// sighting, the drops waiting to be classified, the stalls in progress by
// opening. It is a ring: a steady stream (one in, the oldest out) moves no
// entry and allocates nothing, and only growing copies the log. A slice
// whose front was cut away had to be copied back to its start whenever it
// filled: in a flood of drops that copy, of tens of thousands of waiting
// drops, was a twentieth of the correlator's time.
type fifo[T any] struct {
	s    []T // len(s) is 0 or a power of two
	head int // index of the oldest
	n    int
}

func (l *fifo[T]) push(v T) {
	if l.n == len(l.s) {
		l.resize(max(2*len(l.s), 64))
	}
	l.s[(l.head+l.n)&(len(l.s)-1)] = v
	l.n++
}

// resize moves the log, oldest first, to a new ring of size (a power of
// two, at least l.n).
func (l *fifo[T]) resize(size int) {
	s := make([]T, size)
	if l.n > 0 {
		k := copy(s, l.s[l.head:min(l.head+l.n, len(l.s))])
		copy(s[k:], l.s[:l.n-k])
	}
	l.s, l.head = s, 0
}

func (l *fifo[T]) len() int { return l.n }

// at returns the i-th oldest entry (0 is the front); valid until the next
// push.
func (l *fifo[T]) at(i int) *T { return &l.s[(l.head+i)&(len(l.s)-1)] }

// pop takes the oldest off the log.
func (l *fifo[T]) pop() T {
	p := &l.s[l.head]
	v := *p
	var zero T
	*p = zero // no pointer outlives its entry
	l.head = (l.head + 1) & (len(l.s) - 1)
	l.n--
	return v
}

// front is the oldest; the log must not be empty.
func (l *fifo[T]) front() T { return l.s[l.head] }

// compact gives memory back after a burst. It leaves room for as many
// again: cut to the exact size, a log that holds steady (a tick takes
// its front, pushes refill it) would grow again at once.
func (l *fifo[T]) compact() {
	if len(l.s) > 1024 && len(l.s) > 4*l.n {
		size := 64
		for size < 2*l.n {
			size *= 2
		}
		l.resize(size)
	}
}

// keep drops every entry keep says no to, in order.
func (l *fifo[T]) keep(keep func(T) bool) {
	n := 0
	for i := range l.n {
		if v := *l.at(i); keep(v) {
			*l.at(n) = v
			n++
		}
	}
	var zero T
	for i := n; i < l.n; i++ {
		*l.at(i) = zero
	}
	l.n = n
}
