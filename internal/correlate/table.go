package correlate

// table is a hash map from a non-zero uint64 key to V: open addressing,
// linear probing, deletion by backward shift (no tombstones). The
// correlator inserts and deletes a few keys for every query, steadily;
// Go's maps leave tombstones under that churn and lookups then probe long
// runs. Keys are
// query ids or 64-bit hashes; 0 is the empty slot.
type table[V any] struct {
	slots []slot[V] // key and value side by side: one cache line per probe
	n     int
	shift uint // 64 - log2(len(slots))
}

type slot[V any] struct {
	k uint64
	v V
}

const tableMinBits = 10

func newTable[V any]() table[V] {
	var t table[V]
	t.resize(tableMinBits)
	return t
}

func (t *table[V]) resize(bits uint) {
	old := t.slots
	t.slots, t.n, t.shift = make([]slot[V], 1<<bits), 0, 64-bits
	for _, s := range old {
		if s.k != 0 {
			t.set(s.k, s.v)
		}
	}
}

// slot is where k's probe starts. Fibonacci hashing spreads the keys, but
// four that differ only in their two low bits (consecutive query ids) start
// in one aligned group of four slots, a cache line of pointer slots: the
// query stream's inserts and its evictions then miss the cache once per
// four queries, not once per query. The four go in backwards, the oldest
// last: queries are forgotten oldest first, so a delete's hole is then
// followed by the hole its older neighbour left, and its backward shift
// (del) looks at no slot, where in order it looked at the rest of the
// group and past it, four slots a delete.
func (t *table[V]) slot(k uint64) int {
	return int(((k>>2)*0x9e3779b97f4a7c15)>>(t.shift+2))<<2 | int(^k&3)
}

func (t *table[V]) mask() int { return len(t.slots) - 1 }

// get returns k's value and whether k is present.
func (t *table[V]) get(k uint64) (V, bool) {
	for i := t.slot(k); ; i = (i + 1) & t.mask() {
		switch t.slots[i].k {
		case k:
			return t.slots[i].v, true
		case 0:
			var zero V
			return zero, false
		}
	}
}

// refOrAdd is ref, adding k with a zero value when it is absent: one probe
// run (empty slots hold zero values), two only when the table must grow.
func (t *table[V]) refOrAdd(k uint64) *V {
	for i := t.slot(k); ; i = (i + 1) & t.mask() {
		switch t.slots[i].k {
		case k:
			return &t.slots[i].v
		case 0:
			if 2*(t.n+1) > len(t.slots) {
				t.resize(64 - t.shift + 1)
				return t.refOrAdd(k)
			}
			t.slots[i].k = k
			t.n++
			return &t.slots[i].v
		}
	}
}

// set inserts or replaces k's value. The table stays at most half full, so
// probe runs stay short.
func (t *table[V]) set(k uint64, v V) {
	if 2*(t.n+1) > len(t.slots) {
		t.resize(64 - t.shift + 1)
	}
	for i := t.slot(k); ; i = (i + 1) & t.mask() {
		switch t.slots[i].k {
		case k:
			t.slots[i].v = v
			return
		case 0:
			t.slots[i] = slot[V]{k, v}
			t.n++
			return
		}
	}
}

// find returns the slot that holds k, or -1.
func (t *table[V]) find(k uint64) int {
	for i := t.slot(k); ; i = (i + 1) & t.mask() {
		switch t.slots[i].k {
		case k:
			return i
		case 0:
			return -1
		}
	}
}

// del removes k, shifting the rest of its probe run back so no lookup
// ever crosses a hole.
func (t *table[V]) del(k uint64) {
	if i := t.find(k); i >= 0 {
		t.delAt(i)
	}
}

// delAt empties slot i (full), shifting the rest of its probe run back.
func (t *table[V]) delAt(i int) {
	m := t.mask()
	for j := (i + 1) & m; t.slots[j].k != 0; j = (j + 1) & m {
		// Move j back to the hole at i unless its home slot lies
		// cyclically in (i, j]: then it must stay after i.
		home := t.slot(t.slots[j].k)
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = slot[V]{}
	t.n--
}

func (t *table[V]) len() int { return t.n }

// keepOnly drops every entry keep refuses, in place: one pass over the
// slots from an empty one, each refused entry deleted as del deletes
// (the entries after it in its run shift back, and the slot is looked at
// again), so the entries kept are neither moved nor hashed again, and the
// pass reads and writes the slots in order (no cache miss per entry kept,
// as a rehash into a new array would take). The table then doubles if the
// rest fill more than a quarter of it.
func (t *table[V]) keepOnly(keep func(*V) bool) {
	m := t.mask()
	start := 0 // an empty slot: no run crosses it (the table is never full)
	for t.slots[start].k != 0 {
		start++
	}
	// An entry shifted back lands in the slot just emptied or later in
	// its run: never in a slot the pass has left behind.
	for i, seen := (start+1)&m, 1; seen <= len(t.slots); {
		if t.slots[i].k != 0 && !keep(&t.slots[i].v) {
			t.delAt(i)
			continue
		}
		i, seen = (i+1)&m, seen+1
	}
	if 4*t.n > len(t.slots) {
		t.resize(64 - t.shift + 1)
	}
}

// shrink halves the table while it is at most an eighth full, so a burst
// does not keep its memory forever.
func (t *table[V]) shrink() {
	bits := 64 - t.shift
	for bits > tableMinBits && 8*t.n < 1<<bits {
		bits--
	}
	if bits != 64-t.shift {
		t.resize(bits)
	}
}
