package trace

import (
	"context"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/ctentry"
	"github.com/dnsrace/dnsrace/internal/natrules"
)

// A stale_nat incident says what to do about it: where the entry is, what
// the node's NAT rules send its destination to now, and the command that
// deletes it. They are read as the incident is written (the writer
// goroutine: netlink, and iptables-save where it is installed), never on
// the reader.

// rulesFresh is how long a namespace's NAT rules read are reused.
const rulesFresh = 10 * time.Second

// natReader reads and caches the NAT rules of namespaces. The writer's
// alone.
type natReader struct {
	ns    *namespaces
	read  map[uint32]natRead
	ctNSs func() []uint32 // namespaces where DNS is connection-tracked
}

type natRead struct {
	at    time.Time
	table *natrules.Table
}

func (r *natReader) rules(netns uint32, path string) *natrules.Table {
	if c, ok := r.read[netns]; ok && time.Since(c.at) < rulesFresh {
		return c.table
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t, err := natrules.Read(ctx, path)
	if err != nil {
		t = nil
	}
	r.read[netns] = natRead{at: time.Now(), table: t}
	return t
}

// complete fills in what a stale_nat incident's entry needs from the
// node: its namespace where the drop did not say it (a copy dropped
// elsewhere: the namespaces where DNS is connection-tracked are asked for
// it), the destination's backends now, and the fix.
func (r *natReader) complete(s *correlate.StaleNAT) {
	orig := ctentry.Tuple{Src: s.Entry.Src, Dst: s.Entry.Dst, Proto: unix.IPPROTO_UDP}
	if s.NetNS == 0 {
		for _, ns := range r.ctNSs() {
			p := r.ns.path(ns)
			if p == "" {
				continue
			}
			if _, err := ctentry.Get(p, orig); err == nil {
				s.NetNS = ns
				break
			}
		}
	}
	path := r.ns.path(s.NetNS)
	if s.NetNS == 0 || path == "" {
		return
	}
	if t := r.rules(s.NetNS, path); t != nil {
		if b, from, ok := t.Backends(s.Entry.Dst, unix.IPPROTO_UDP); ok {
			s.Backends, s.BackendsFrom = b, from
		}
	}
	s.Fix = ctentry.DeleteCommand(path, orig)
}
