package trace

import (
	"bytes"
	"fmt"
	"os"
	"slices"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"

	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// The tracepoint tier on Linux 6.4+ sees merged clash losers through a
// netfilter program just before confirm, linked per namespace. It is linked
// where races can happen and nowhere else (it runs for every packet that
// leaves or enters a namespace it is linked in): at start in every
// namespace that NATs, later in each namespace the kernel side announces a
// DNS entry in. A namespace watched is held alive by its links, so they are
// closed once nothing else holds it (release.go).

// watchNAT links the netfilter program in every namespace known that has
// NAT rules (nftables chains of type nat, or the legacy iptables nat table).
func (s *Session) watchNAT() {
	if !s.tracer.HasNetfilter() {
		return
	}
	for ino, path := range s.ns.living() {
		if hasNAT(path) {
			s.watch(ino, path)
		}
	}
}

// watch links the netfilter program in namespace ino; a failure is kept
// for the summary, never fatal: the namespace's counters then say what
// was missed.
func (s *Session) watch(ino uint32, path string) {
	if !s.tracer.HasNetfilter() {
		return
	}
	if path == "" {
		path = s.ns.path(ino)
	}
	if path == "" {
		s.watchErrs = append(s.watchErrs, fmt.Sprintf("namespace %d: no path to it", ino))
		return
	}
	if err := s.tracer.WatchNetNS(ino, path); err != nil {
		s.watchErrs = append(s.watchErrs, err.Error())
	}
}

// watchLate links the netfilter program in a namespace whose DNS showed
// only now: the races its counter took before (since dnsrace's baseline
// of it) are kept as counted, not named. The program is linked first and
// the counter read after, so no race falls between the two; the races of
// queries sent before the read are the counter's, not the records', so
// none is counted twice.
func (s *Session) watchLate(ino uint32) {
	if !s.tracer.HasNetfilter() || slices.Contains(s.tracer.Watched(), ino) {
		return
	}
	s.watch(ino, "")
	s.corr.CountRescuesFrom(ino, monoNow())
	if k, ok := s.ns.Delta(ino); ok && k.ClashResolve > 0 {
		if s.unwatched == nil {
			s.unwatched = map[uint32]uint64{}
		}
		s.unwatched[ino] = k.ClashResolve
	}
}

// hasNAT reports whether the namespace at path has NAT rules: an nftables
// chain of type nat (iptables-nft makes those too), or the legacy iptables
// nat table.
func hasNAT(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd()))); err == nil {
		if chains, err := c.ListChains(); err == nil {
			for _, ch := range chains {
				if ch.Type == nftables.ChainTypeNAT {
					return true
				}
			}
		}
	}
	nat := false
	_ = nsutil.DoHandle(netns.NsHandle(int(f.Fd())), func() error {
		for _, names := range []string{"/proc/thread-self/net/ip_tables_names", "/proc/thread-self/net/ip6_tables_names"} {
			b, _ := os.ReadFile(names)
			for _, t := range bytes.Fields(b) {
				nat = nat || string(t) == "nat"
			}
		}
		return nil
	})
	return nat
}
