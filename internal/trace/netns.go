package trace

import (
	"os"
	"path/filepath"
	"sync"

	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// nsCounters finds namespaces by inode and keeps their conntrack counter
// baselines. It implements correlate.CounterSource.
type nsCounters struct {
	mu       sync.Mutex
	procRoot string
	paths    map[uint32]string
	base     map[uint32]ctstats.Counters
	readers  map[uint32]*ctstats.Reader
	late     map[uint32]bool
	lastScan int64
}

func newNSCounters(procRoot string) *nsCounters {
	n := &nsCounters{procRoot: procRoot, paths: map[uint32]string{}, base: map[uint32]ctstats.Counters{},
		readers: map[uint32]*ctstats.Reader{}, late: map[uint32]bool{}}
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
	n.readers[ns], n.base[ns] = r, s.Total
	if late {
		n.late[ns] = true
	}
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

// Delta returns the counters of ns since its baseline.
func (n *nsCounters) Delta(ns uint32) (ctstats.Counters, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r, ok := n.readers[ns]
	if !ok {
		return ctstats.Counters{}, false
	}
	s, err := r.Read()
	if err != nil {
		return ctstats.Counters{}, false
	}
	return s.Total.Sub(n.base[ns]), true
}

func (n *nsCounters) path(ns uint32) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.paths[ns]
}

func (n *nsCounters) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, r := range n.readers {
		r.Close()
	}
	n.readers = map[uint32]*ctstats.Reader{}
}
