package correlate

import "github.com/dnsrace/dnsrace/internal/event"

// A query NAT rewrote may be dropped where no earlier hop of it was seen:
// a bridge floods a frame whose destination it does not know (the backend
// it was NATed to is gone) to every other host on it, and each drops its
// copy (OTHERHOST). The kernel side, which follows a query by its entry,
// cannot tell such a copy from a new query there (it carries no entry in
// that namespace), and reports it as a query first seen at its drop
// (event.FlagAtDrop). Here it is found to be a copy of a query followed
// already, by its DNS id and question, sent moments before from another
// namespace to another destination, and its drop becomes evidence about
// that query.

// copyWindow bounds how long after a query a copy of it may be dropped (a
// neighbour resolution holds it up to a few seconds).
const copyWindow = 3e9 // ns

// byIDSlots is the size of the table of the latest query per DNS id and
// question: direct-mapped, a slot per query.
const byIDSlots = 1 << 13

type byIDRef struct {
	key uint64
	qid uint64
}

func byIDKey(id, qtype uint16, name uint64) uint64 {
	return name ^ uint64(qtype)*0x9e3779b97f4a7c15 ^ (uint64(id)+1)*0xc2b2ae3d27d4eb4f
}

// noteByID records q as the latest query with its id and question.
func (c *Correlator) noteByID(q *query) {
	k := byIDKey(q.id, q.qtype, q.name)
	c.byID[k>>51&(byIDSlots-1)] = byIDRef{key: k, qid: q.qid}
}

// copyOf returns the query e, a query first seen at its drop, is a copy
// of, or nil.
func (c *Correlator) copyOf(e *event.Event, name uint64) *query {
	// A query dropped inside its own send (a forwarder that kept its
	// client's DNS id, as dnsmasq does) is no copy: a copy is received.
	if e.Flags&event.FlagAtDrop == 0 || e.Flags&event.FlagSender != 0 {
		return nil
	}
	k := byIDKey(e.DNS.ID, e.DNS.QType, name)
	r := c.byID[k>>51&(byIDSlots-1)]
	if r.key != k {
		return nil
	}
	u := c.ix.lookup(r.qid)
	// A copy is of another destination (NAT rewrote it); it may be
	// dropped in the asker's own namespace (the bridge floods it back).
	if u == nil || u.dead || u.dst == e.Packet.Dst || e.TimeNs > u.sentNs+copyWindow {
		return nil
	}
	return u
}

// copied is a copy found, until its drop record is read.
type copied struct {
	orig uint64      // the query's qid
	pkt  event.Tuple // the copy's addresses, after NAT
	atNs uint64
}

// forgetCopies drops copies whose drop never came.
func (c *Correlator) forgetCopies(now uint64) {
	for qid, cp := range c.copies {
		if cp.atNs+copyWindow < now {
			delete(c.copies, qid)
		}
	}
}
