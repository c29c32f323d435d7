package trace

import (
	"sync/atomic"

	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/metrics"
)

// MetricsSource is what /metrics reads at scrape time from the session that
// live points to once it runs (before that: nothing). The metrics server
// starts before the probes load, so a scrape during start-up still answers.
func MetricsSource(live *atomic.Pointer[Session]) metrics.Source {
	return metrics.Source{
		EventsLost: func() uint64 {
			if s := live.Load(); s != nil {
				return s.Live().EventsLost
			}
			return 0
		},
		Missed: func() map[string]uint64 {
			if s := live.Load(); s != nil {
				return s.Missed()
			}
			return nil
		},
		Probes: func() []metrics.Probe {
			s := live.Load()
			if s == nil {
				return nil
			}
			var ps []metrics.Probe
			for _, p := range s.Probes() {
				ps = append(ps, metrics.Probe{Hook: p.Hook, Tier: p.Tier.String(), Attached: p.Attached})
			}
			return ps
		},
		Untracked: func() uint64 {
			if s := live.Load(); s != nil {
				return s.Live().Untracked
			}
			return 0
		},
		Conntrack: func() map[uint32]ctstats.Counters {
			if s := live.Load(); s != nil {
				return s.Conntrack()
			}
			return nil
		},
	}
}
