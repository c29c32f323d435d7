package trace

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
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
	why          string         // what could not be read, and why
	src          netip.AddrPort // the entry's real source, where the socket had none
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
		var tried []string
		for _, ns := range r.ctNSs() {
			p := r.ns.path(ns)
			if p == "" {
				tried = append(tried, fmt.Sprintf("netns %d: no path", ns))
				continue
			}
			e, err := findEntry(p, orig, s.Gone)
			if err != nil {
				tried = append(tried, fmt.Sprintf("netns %d: %v", ns, err))
				continue
			}
			rd.netns, orig = ns, e.Orig
			break
		}
		if rd.netns == 0 {
			rd.why = fmt.Sprintf("the entry was not found where DNS is tracked [%s]", strings.Join(tried, "; "))
			return
		}
	}
	path := r.ns.path(rd.netns)
	if path == "" {
		rd.why = fmt.Sprintf("netns %d had no path left to enter", rd.netns)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), natWait)
	defer cancel()
	t, err := natrules.Read(ctx, path)
	if err != nil {
		rd.why = "NAT rules unreadable: " + err.Error()
	} else if b, from, ok := t.Backends(s.Entry.Dst, unix.IPPROTO_UDP); ok {
		rd.backendAddrs, rd.from = b, from
	} else {
		rd.why = fmt.Sprintf("no NAT rule for %s found", s.Entry.Dst)
	}
	rd.fix = ctentry.DeleteCommand(path, orig)
	if slices.Contains(rd.backendAddrs, s.Gone) {
		// The rules still send the VIP there: its server, not the
		// entry, is what stopped answering.
		rd.fix = ""
		rd.why = fmt.Sprintf("the NAT rules still send %s to %s: its server does not answer, the entry is not stale", s.Entry.Dst, s.Gone)
	}
	if orig.Src != s.Entry.Src {
		rd.src = orig.Src
	}
}

// findEntry finds the entry with original tuple orig. A socket with no
// source address of its own (bound to the wildcard: a forwarder's query
// port) sent from the one routing chose, which the entry has: then the
// entry is the one from orig's port to its destination that NATs to gone.
func findEntry(path string, orig ctentry.Tuple, gone netip.AddrPort) (ctentry.Entry, error) {
	if !orig.Src.Addr().IsUnspecified() {
		return ctentry.Get(path, orig)
	}
	es, err := ctentry.Dump(path, func(e ctentry.Entry) bool {
		return e.Orig.Proto == orig.Proto && e.Orig.Src.Port() == orig.Src.Port() && e.Orig.Dst == orig.Dst &&
			e.DNATTarget() == gone
	})
	if err != nil {
		return ctentry.Entry{}, err
	}
	if len(es) != 1 {
		return ctentry.Entry{}, fmt.Errorf("%d entries from port %d to %s sent to %s: %w", len(es), orig.Src.Port(), orig.Dst, gone, ctentry.ErrNotFound)
	}
	return es[0], nil
}

// complete fills in s from its entry's reading, waiting for it a while.
func (r *natReader) complete(s *correlate.StaleNAT) {
	r.mu.Lock()
	rd, ok := r.byKey[s.Entry]
	r.mu.Unlock()
	if !ok {
		s.Unread = "the entry was never read"
		return
	}
	select {
	case <-rd.done:
	case <-time.After(natWait):
		s.Unread = "the entry's reading took longer than " + natWait.String()
		return
	}
	if s.NetNS == 0 {
		s.NetNS = rd.netns
	}
	s.Backends, s.BackendsFrom, s.Fix, s.Unread = rd.backendAddrs, rd.from, rd.fix, rd.why
	if rd.src.IsValid() {
		s.Entry.Src = rd.src
	}
}
