package trace

import (
	"context"
	"slices"
	"time"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// Pods come and go; dnsrace must never be what keeps one's network
// namespace alive. What it holds in a namespace (a counter reader, the
// netfilter program's links) keeps the namespace and its interfaces alive
// after its last process and its name are gone, so packets would still
// reach a deleted pod. A scanner goroutine finds, every NamespaceScanEvery,
// the namespaces a process or a name still holds (nsutil.Living: a walk of
// /proc, kept off the reader's thread); the reader then lets go of each
// namespace goneAfter scans in a row missed: it reads its counters one
// last time, closes its reader and links, makes the kernel side forget it,
// and keeps its reconciliation in the summary (Released).

// DefaultNamespaceScan is how often the living namespaces are looked for.
const DefaultNamespaceScan = 10 * time.Second

// maxReleasedListed is how many released namespaces the summary lists one
// by one (the newest); older ones are summed in ReleasedEarlier, so a
// tracer that runs for weeks on a node with pod churn stays the same size.
const maxReleasedListed = 1024

// scanNamespaces is the scanner goroutine.
func (s *Session) scanNamespaces(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		alive := nsutil.Living(s.opts.ProcRoot)
		// A scan the reader has not taken yet is stale now.
		select {
		case <-s.scans:
		default:
		}
		s.scans <- alive
	}
}

// takeScan lets go of the namespaces a new scan, if there is one, found
// gone; on the reader.
func (s *Session) takeScan() {
	select {
	case alive := <-s.scans:
		for _, rel := range s.ns.Gone(alive) {
			s.letGo(rel)
		}
	default:
	}
}

// letGo ends the session's hold on a namespace the kernel may now free;
// on the reader.
func (s *Session) letGo(rel released) {
	watched := slices.Contains(s.tracer.Watched(), rel.ino)
	s.tracer.ForgetNetNS(rel.ino)
	a := s.corr.ForgetNamespace(rel.ino)
	before := s.unwatched[rel.ino]
	if rel.read || watched {
		s.releasedCount++
	}
	if s.ctNS[rel.ino] || a != (correlate.Attributed{}) || before > 0 {
		a.ClashResolve += before
		ns := NamespaceSummary{NetNS: rel.ino, Path: rel.path, Kernel: rel.delta, Attributed: a, Late: rel.late,
			Watched: watched, ClashBeforeWatched: before, Released: true}
		// Appending to a clipped slice copies it: snapshots keep theirs.
		s.released = append(slices.Clip(s.released), ns)
		if len(s.released) > maxReleasedListed {
			s.releasedEarlier.add(s.released[0])
			s.released = slices.Clone(s.released[1:])
		}
	}
	delete(s.ctNS, rel.ino)
	delete(s.unwatched, rel.ino)
}

// ReleasedSum sums the released namespaces the summary no longer lists.
type ReleasedSum struct {
	Namespaces         int                  `json:"namespaces"`
	Kernel             ctstats.Counters     `json:"kernel"`
	Attributed         correlate.Attributed `json:"attributed"`
	ClashBeforeWatched uint64               `json:"clash_resolve_before_watched,omitempty"`
}

func (r *ReleasedSum) add(ns NamespaceSummary) {
	r.Namespaces++
	r.Kernel.Add(ns.Kernel)
	r.Attributed.Add(ns.Attributed)
	r.ClashBeforeWatched += ns.ClashBeforeWatched
}
