package trace

import (
	"sync"

	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// namespaces keeps the conntrack counter baselines of the network
// namespaces dnsrace reconciles, and holds nothing of a namespace longer
// than something else does.
//
// A baseline is read at start for every namespace alive then, through a
// reader opened and closed at once; a namespace whose DNS shows only later
// (Seen) and that was not alive at start gets its baseline then (late). A
// reader is kept open only for a namespace where DNS is connection-tracked
// (Seen), because the reconciliation reads its counters on every netfilter
// drop there: a ctnetlink socket holds its namespace alive, interfaces and
// all, so once no process and no name holds the namespace any more (Gone),
// its counters are read one last time and the reader is closed.
//
// It implements correlate.CounterSource and is safe for concurrent use:
// the reader goroutine, /metrics and SIGUSR1 all read it. Each namespace
// has a lock of its own, so a scrape reading one namespace's counters
// never holds up the reader on another.
type namespaces struct {
	procRoot string
	mu       sync.Mutex // guards byIno and alive
	byIno    map[uint32]*nsCounters
	// alive is the last scan's namespaces (nsutil.Living), to find a
	// path for one that shows without a rescan.
	alive map[uint32]string
}

// nsCounters is one namespace's baseline and, while held, its reader.
type nsCounters struct {
	mu    sync.Mutex // one netlink read at a time; guards r, path, base, late
	ino   uint32
	path  string
	base  ctstats.Counters
	based bool // base was read
	late  bool // the baseline was taken after tracing began
	r     *ctstats.Reader
	// missed counts the scans in a row that did not find it alive.
	missed int
}

// released is what a namespace let go of leaves behind: its counters
// since its baseline, read just before its reader was closed.
type released struct {
	ino   uint32
	path  string
	delta ctstats.Counters
	read  bool // delta was read (a reader was open)
	late  bool
}

// goneAfter is how many scans in a row must miss a namespace before it is
// let go: a drop in it is decided a quarter second after it happened, and
// one scan's interval must pass between the last sight of it and its
// release, so nothing is pending there when its counters are read for the
// last time.
const goneAfter = 2

func newNamespaces(procRoot string) *namespaces {
	n := &namespaces{procRoot: procRoot, byIno: map[uint32]*nsCounters{}, alive: nsutil.Living(procRoot)}
	for ino, p := range n.alive {
		c := &nsCounters{ino: ino, path: p}
		if r, err := ctstats.OpenInode(p, ino); err == nil {
			s, err := r.Read()
			r.Close()
			c.base, c.based = s.Total, err == nil
		}
		n.byIno[ino] = c
	}
	return n
}

// living returns the namespaces alive as of the last scan (a copy).
func (n *namespaces) living() map[uint32]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[uint32]string, len(n.alive))
	for k, v := range n.alive {
		out[k] = v
	}
	return out
}

// livingPath is a path to ns as of the last scan.
func (n *namespaces) livingPath(ns uint32) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.alive[ns]
	return p, ok
}

// Seen opens ns's reader, where DNS is connection-tracked from now on,
// taking its baseline now if it has none (a namespace born since start).
// Seen and Gone, which add and remove namespaces, are the session reader's
// alone.
func (n *namespaces) Seen(ns uint32) {
	c := n.get(ns)
	if c == nil {
		p, ok := n.livingPath(ns)
		if !ok {
			if p, ok = n.rescan()[ns]; !ok {
				return
			}
		}
		c = &nsCounters{ino: ns, path: p}
		n.mu.Lock()
		n.byIno[ns] = c
		n.mu.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.r != nil {
		return
	}
	r, err := ctstats.OpenInode(c.path, ns)
	if err != nil {
		// The path found earlier is stale (its process gone): look again.
		p, ok := n.rescan()[ns]
		if !ok {
			return
		}
		c.path = p
		if r, err = ctstats.OpenInode(p, ns); err != nil {
			return
		}
	}
	if !c.based {
		s, err := r.Read()
		if err != nil {
			r.Close()
			return
		}
		c.base, c.based, c.late = s.Total, true, true
	}
	c.r = r
}

// rescan scans the living namespaces now (not under n.mu).
func (n *namespaces) rescan() map[uint32]string {
	alive := nsutil.Living(n.procRoot)
	n.mu.Lock()
	n.alive = alive
	n.mu.Unlock()
	return alive
}

func (n *namespaces) get(ns uint32) *nsCounters {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.byIno[ns]
}

// Delta returns the counters of ns since its baseline, read now, opening
// its reader if it has none yet (a drop there needs them before any DNS
// entry shows: a full table refuses every entry); false where there is no
// baseline (a namespace born since start that never showed DNS) or no path
// to it any more.
func (n *namespaces) Delta(ns uint32) (ctstats.Counters, bool) {
	c := n.get(ns)
	if c == nil {
		return ctstats.Counters{}, false
	}
	c.mu.Lock()
	if c.r == nil && c.based {
		c.mu.Unlock()
		n.Seen(ns)
		c.mu.Lock()
	}
	defer c.mu.Unlock()
	return c.delta()
}

// delta reads the counters since the baseline; under c.mu.
func (c *nsCounters) delta() (ctstats.Counters, bool) {
	if c.r == nil {
		return ctstats.Counters{}, false
	}
	s, err := c.r.Read()
	if err != nil {
		return ctstats.Counters{}, false
	}
	return s.Total.Sub(c.base), true
}

func (n *namespaces) isLate(ns uint32) bool {
	c := n.get(ns)
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.late
}

func (n *namespaces) path(ns uint32) string {
	c := n.get(ns)
	if c == nil {
		return ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.path
}

// held counts the namespaces dnsrace holds: a counter reader open, or in
// watched (the netfilter program's links).
func (n *namespaces) held(watched map[uint32]bool) int {
	n.mu.Lock()
	cs := make([]*nsCounters, 0, len(n.byIno))
	for _, c := range n.byIno {
		cs = append(cs, c)
	}
	n.mu.Unlock()
	held := 0
	for _, c := range cs {
		c.mu.Lock()
		if c.r != nil || watched[c.ino] {
			held++
		}
		c.mu.Unlock()
	}
	return held
}

// Gone takes a scan of the living namespaces (nsutil.Living) and lets go
// of every namespace goneAfter scans in a row did not find: its counters
// are read one last time and its reader closed. It returns what those
// namespaces leave behind.
func (n *namespaces) Gone(alive map[uint32]string) []released {
	n.mu.Lock()
	n.alive = alive
	var gone []*nsCounters
	for ino, c := range n.byIno {
		if p, ok := alive[ino]; ok {
			c.missed = 0
			c.mu.Lock()
			c.path = p // the old one (a PID's) may name no namespace soon
			c.mu.Unlock()
			continue
		}
		if c.missed++; c.missed >= goneAfter {
			gone = append(gone, c)
			delete(n.byIno, ino)
		}
	}
	n.mu.Unlock()
	out := make([]released, 0, len(gone))
	for _, c := range gone {
		c.mu.Lock()
		rel := released{ino: c.ino, path: c.path, late: c.late}
		rel.delta, rel.read = c.delta()
		if c.r != nil {
			c.r.Close()
			c.r = nil
		}
		c.mu.Unlock()
		out = append(out, rel)
	}
	return out
}

func (n *namespaces) close() {
	n.mu.Lock()
	cs := n.byIno
	n.byIno = map[uint32]*nsCounters{}
	n.mu.Unlock()
	for _, c := range cs {
		c.mu.Lock()
		if c.r != nil {
			c.r.Close()
			c.r = nil
		}
		c.mu.Unlock()
	}
}
