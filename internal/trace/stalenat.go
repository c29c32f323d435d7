package trace

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/ctentry"
	"github.com/dnsrace/dnsrace/internal/natrules"
)

// A stale_nat incident says what to do about it: where the entry is, what
// the node's NAT rules send its destination to now, and the command that
// deletes it. They are read in the background as soon as the correlator
// decides the loss (the entry and its namespace exist then; the incident
// is written seconds later, when either may be gone), over netlink and
// with iptables-save where it is installed: never on the reader.

// natWait bounds how long the writer waits for an entry's reading.
const natWait = 3 * time.Second

// natReader reads, in the background, what stale_nat incidents need.
type natReader struct {
	ns    *namespaces
	ctNSs func() []uint32 // namespaces where DNS is connection-tracked

	mu    sync.Mutex
	byKey map[correlate.Flow]*natRead // by the entry's tuples
}

// natRead is one entry's reading; done closes when it is complete.
type natRead struct {
	done         chan struct{}
	at           time.Time
	netns        uint32
	from, fix    string
	backendAddrs []netip.AddrPort
}

// request starts reading s's entry, once per entry (and again once its
// reading is older than a minute).
func (r *natReader) request(s correlate.StaleNAT) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rd, ok := r.byKey[s.Entry]; ok && time.Since(rd.at) < time.Minute {
		return
	}
	if len(r.byKey) > 1024 {
		clear(r.byKey) // a node full of stale entries: start over
	}
	rd := &natRead{done: make(chan struct{}), at: time.Now()}
	r.byKey[s.Entry] = rd
	go func() {
		defer close(rd.done)
		r.read(s, rd)
	}()
}

func (r *natReader) read(s correlate.StaleNAT, rd *natRead) {
	orig := ctentry.Tuple{Src: s.Entry.Src, Dst: s.Entry.Dst, Proto: unix.IPPROTO_UDP}
	rd.netns = s.NetNS
	if rd.netns == 0 {
		// A copy dropped elsewhere: the entry is where DNS is tracked.
		for _, ns := range r.ctNSs() {
			if p := r.ns.path(ns); p != "" {
				if _, err := ctentry.Get(p, orig); err == nil {
					rd.netns = ns
					break
				}
			}
		}
	}
	path := r.ns.path(rd.netns)
	if rd.netns == 0 || path == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), natWait)
	defer cancel()
	if t, err := natrules.Read(ctx, path); err == nil {
		if b, from, ok := t.Backends(s.Entry.Dst, unix.IPPROTO_UDP); ok {
			rd.backendAddrs, rd.from = b, from
		}
	}
	rd.fix = ctentry.DeleteCommand(path, orig)
}

// complete fills in s from its entry's reading, waiting for it a while.
func (r *natReader) complete(s *correlate.StaleNAT) {
	r.mu.Lock()
	rd, ok := r.byKey[s.Entry]
	r.mu.Unlock()
	if !ok {
		return
	}
	select {
	case <-rd.done:
	case <-time.After(natWait):
		return
	}
	if s.NetNS == 0 {
		s.NetNS = rd.netns
	}
	s.Backends, s.BackendsFrom, s.Fix = rd.backendAddrs, rd.from, rd.fix
}
