package trace

import (
	"os"
	"path/filepath"
	"sync"

	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// nsCounters finds namespaces by inode and keeps their conntrack counter
// baselines. It implements correlate.CounterSource and is safe for
// concurrent use: the reader, /metrics and SIGUSR1 all read it. Each
// namespace has a lock of its own, so a scrape reading one namespace's
// counters never holds up the reader on another.
type nsCounters struct {
	mu       sync.Mutex // guards paths and readers (not the reads)
	procRoot string
	paths    map[uint32]string
	readers  map[uint32]*nsReader
}

// nsReader is one namespace's counter reader and its baseline.
type nsReader struct {
	mu   sync.Mutex // one netlink read at a time
	r    *ctstats.Reader
	base ctstats.Counters
	late bool // the baseline was taken after tracing began
}

func newNSCounters(procRoot string) *nsCounters {
	n := &nsCounters{procRoot: procRoot, paths: map[uint32]string{}, readers: map[uint32]*nsReader{}}
	n.scan()
	for ns := range n.paths {
		n.baseline(ns, false)
	}
	return n
}

// scan finds named namespaces and every process's namespace.
func (n *nsCounters) scan() {
	add := func(p string) {
		if ino, ok := nsutil.PathInode(p); ok {
			if _, known := n.paths[ino]; !known {
				n.paths[ino] = p
			}
		}
	}
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ents {
			add(filepath.Join("/run/netns", e.Name()))
		}
	}
	procs, _ := filepath.Glob(filepath.Join(n.procRoot, "[0-9]*", "ns", "net"))
	for _, p := range procs {
		add(p)
	}
}

// baseline opens ns's reader and takes its baseline; under n.mu.
func (n *nsCounters) baseline(ns uint32, late bool) bool {
	if _, ok := n.readers[ns]; ok {
		return true
	}
	p, ok := n.paths[ns]
	if !ok {
		return false
	}
	r, err := ctstats.Open(p)
	if err != nil {
		return false
	}
	s, err := r.Read()
	if err != nil {
		r.Close()
		return false
	}
	n.readers[ns] = &nsReader{r: r, base: s.Total, late: late}
	return true
}

// Seen makes sure ns has a baseline (a rescan finds namespaces born since).
func (n *nsCounters) Seen(ns uint32) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.readers[ns]; ok {
		return
	}
	if _, ok := n.paths[ns]; !ok {
		n.scan()
	}
	n.baseline(ns, true)
}

func (n *nsCounters) reader(ns uint32) *nsReader {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.readers[ns]
}

// Delta returns the counters of ns since its baseline.
func (n *nsCounters) Delta(ns uint32) (ctstats.Counters, bool) {
	nr := n.reader(ns)
	if nr == nil {
		return ctstats.Counters{}, false
	}
	nr.mu.Lock()
	defer nr.mu.Unlock()
	if nr.r == nil {
		return ctstats.Counters{}, false
	}
	s, err := nr.r.Read()
	if err != nil {
		return ctstats.Counters{}, false
	}
	return s.Total.Sub(nr.base), true
}

func (n *nsCounters) isLate(ns uint32) bool {
	nr := n.reader(ns)
	return nr != nil && nr.late
}

// allPaths returns a copy of every namespace known, by inode.
func (n *nsCounters) allPaths() map[uint32]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[uint32]string, len(n.paths))
	for k, v := range n.paths {
		out[k] = v
	}
	return out
}

func (n *nsCounters) path(ns uint32) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.paths[ns]
}

func (n *nsCounters) close() {
	n.mu.Lock()
	rs := n.readers
	n.readers = map[uint32]*nsReader{}
	n.mu.Unlock()
	for _, nr := range rs {
		nr.mu.Lock()
		nr.r.Close()
		nr.r = nil
		nr.mu.Unlock()
	}
}
