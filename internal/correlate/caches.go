package correlate

import (
	"hash/maphash"
	"strconv"

	"github.com/dnsrace/dnsrace/internal/event"
)

// This file holds the correlator's caches of names: question names
// interned by hash, drop locations and process names as the writers show
// them, so the hot path neither allocates nor formats them per record.

func (c *Correlator) hashName(b []byte) uint64 { return maphash.Bytes(c.seed, b) }

// shownName is the shown form of q's name (event.Name.String), made once
// per name while the name stays interned: a flood's stalls mostly ask the
// same few names.
func (c *Correlator) shownName(q *query) string {
	e := &c.strs[q.name&(internSlots-1)]
	if e.h != q.name || e.n != q.qname {
		return q.qname.String()
	}
	if e.s == "" {
		e.s = e.n.String()
	}
	return e.s
}

// internSlots is the size of the name intern cache: direct-mapped, so a
// name costs one load to find, and a node that asks for every name once
// (a flood, a scan) evicts in place instead of growing and clearing a
// map.
const internSlots = 1 << 13

type interned struct {
	h uint64
	n event.Name
	s string // n's shown form, once an incident asked for it
}

// intern returns the question's name as a string, shared with earlier
// queries for the same name: a busy node asks for few distinct names, so
// the hot path neither allocates a string nor converts the name from its
// wire form per query. h, the hash of its wire form, is the name's identity
// here as everywhere in the correlator (retries, siblings).
func (c *Correlator) intern(h uint64, d *event.DNS) event.Name {
	e := &c.strs[h&(internSlots-1)]
	if e.h != h || e.n == (event.Name{}) {
		*e = interned{h: h, n: d.Name()}
	}
	return e.n
}

const locSlots = 64

type location struct {
	addr uint64
	sym  string // the function, for the rules
	s    string // "nf_hook_slow+0x7d", for the writers
}

// location names a drop location, from the cache when it can: the
// function that freed the packet (Config.Symbol; "" when unknown), and the
// location as the writers show it, as ksym.Table.Format writes it.
func (c *Correlator) location(addr uint64) (sym, shown string) {
	e := &c.locs[(addr^addr>>6)&(locSlots-1)]
	if e.addr != addr || addr == 0 {
		*e = location{addr: addr}
		if name, off, ok := c.cfg.Symbol(addr); ok {
			e.sym = name
			e.s = name + "+0x" + strconv.FormatUint(off, 16)
		} else if addr != 0 {
			e.s = "0x" + strconv.FormatUint(addr, 16)
		}
	}
	return e.sym, e.s
}

// comm returns a process name as a string, shared with the last incidents
// of the same process: a flood's incidents mostly come from a few.
func (c *Correlator) comm(b [16]byte) string {
	e := &c.comms[(uint(b[0])+uint(b[1])*7+uint(b[2])*31+uint(b[3])*131)&(commSlots-1)]
	if e.b != b || e.s == "" {
		e.b, e.s = b, event.CommString(b)
	}
	return e.s
}

const commSlots = 16
