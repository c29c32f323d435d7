package correlate

// queryLog is the queries in flight by first sighting, oldest first. The
// slots of queries taken off the front are reused in place, so a steady
// stream (one query in, the oldest evicted) allocates nothing: re-slicing
// the front away made append copy the whole log to a new array every
// few thousand queries, and that garbage kept the GC and its write
// barriers running on the read path.
type queryLog struct {
	s    []*query
	head int // s[:head] were taken off the front (nil)
}

func (l *queryLog) push(q *query) {
	if len(l.s) == cap(l.s) && l.head >= len(l.s)/2 {
		n := copy(l.s, l.s[l.head:])
		clear(l.s[n:])
		l.s, l.head = l.s[:n], 0
	}
	l.s = append(l.s, q)
}

// live is the log, oldest first; valid until the next push.
func (l *queryLog) live() []*query { return l.s[l.head:] }

func (l *queryLog) len() int { return len(l.s) - l.head }

// pop takes the oldest query off the log.
func (l *queryLog) pop() *query {
	q := l.s[l.head]
	l.s[l.head] = nil
	l.head++
	return q
}

// front is the oldest query; the log must not be empty.
func (l *queryLog) front() *query { return l.s[l.head] }

// compact gives memory back after a burst.
func (l *queryLog) compact() {
	if n := l.len(); cap(l.s) > 1024 && cap(l.s) > 4*n {
		l.s, l.head = append([]*query(nil), l.live()...), 0
	}
}
