package correlate

// A forwarder's incident waits while a client's query that joined its
// stall is still open (forwarder.go, awaited). The queries and stalls that
// could have joined one are another client's that asked its namespace the
// same question: they are counted by question and namespace asked
// (askSlot), with whether more than one client's are counted, so that an
// incident whose namespace nobody else asks that question (nearly every
// incident: a pod's, whose namespace nobody asks; a flood's, all of one
// client) looks no further. Counting writes one slot of a small table, and
// never the memory of another query. A slot's clients are told apart
// without their names: queries of two names that share a slot are often
// of one client (a flood), seldom of two.

// askSlots is the size of the tables: questions share a slot when their
// hashes collide, which only makes an incident look for askers in vain.
const askSlots = 1 << 12

// askSlot is the slot of a question asked of namespace asked.
func askSlot(name uint64, qtype uint16, asked uint32) uint64 {
	return (name ^ uint64(qtype)*0x9e3779b97f4a7c15 ^ uint64(asked)*0xc2b2ae3d27d4eb4f) >> 52 & (askSlots - 1)
}

// askCount counts the queries (or stalls) of a slot.
type askCount struct {
	n     uint32
	mixed bool   // since n was last 0, more than one client's were counted
	who   uint64 // the first of them (clientOf)
}

func (a *askCount) add(who uint64) {
	switch {
	case a.n == 0:
		a.who, a.mixed = who, false
	case a.who != who:
		a.mixed = true
	}
	a.n++
}

func (a *askCount) sub() { a.n-- }

// others: a query of a client other than who may be counted.
func (a *askCount) others(who uint64) bool { return a.n > 0 && (a.mixed || a.who != who) }

// clientOf is the client that sent q, whatever it asked: its namespace
// and lookupOwner.
func clientOf(q *query) uint64 { return uint64(nameOf(q.netns, 0, lookupOwner(q))) }
