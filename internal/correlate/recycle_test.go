package correlate_test

import (
	"bytes"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/correlate"
)

// TestRecycleChangesNothing: giving every incident back (Recycle) as soon
// as it is written changes no incident: two floods of drops, written as
// JSON once with their stalls reused and once without, give the same
// bytes. The forwarder flood holds incidents ForwarderGrace and names
// past stalls for its clients' late answers (its history), where a stall
// reused too early would show. In the rcvbuf flood, whose incidents are
// all stalls', recycling allocates less: about a stall per lookup fewer,
// once as many are free as are in flight.
func TestRecycleChangesNothing(t *testing.T) {
	for _, c := range []struct {
		name   string
		stream func(onIncident func(*correlate.Incident)) (*correlate.Correlator, func(uint64), uint64)
		stalls bool // every incident a stall's
	}{
		{"forwarder", forwarderFlood, false},
		{"rcvbuf", func(on func(*correlate.Incident)) (*correlate.Correlator, func(uint64), uint64) {
			c := correlate.New(correlate.Config{
				ResolverTimeout: 50 * time.Millisecond, QueryTTL: 100 * time.Millisecond, ForwarderGrace: 50 * time.Millisecond,
				ReasonName: func(uint32) string { return "SOCKET_RCVBUFF" },
				OnIncident: on,
			})
			client := netip.MustParseAddrPort("127.0.0.1:38658")
			return c, floodStream(c, func(uint64) netip.AddrPort { return client }, 3, 6, 0xffffffff81a3c437), 100000
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			write := func(recycle bool) ([]byte, int, uint64) {
				var out, line []byte
				var pending []*correlate.Incident
				corr, run, warm := c.stream(func(inc *correlate.Incident) { pending = append(pending, inc) })
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				for i := range 3 * warm {
					run(i)
					for _, inc := range pending {
						line = inc.AppendJSON(line[:0])
						out = append(append(out, line...), '\n')
						if recycle {
							corr.Recycle(inc)
						}
					}
					pending = pending[:0]
				}
				runtime.ReadMemStats(&after)
				return out, bytes.Count(out, []byte{'\n'}), after.Mallocs - before.Mallocs
			}
			want, incidents, allocs := write(false)
			got, _, allocsRecycled := write(true)
			if incidents < 1000 {
				t.Fatalf("%d incidents: the stream is wrong", incidents)
			}
			t.Logf("%d incidents; %d allocations, %d recycling", incidents, allocs, allocsRecycled)
			if saved := int64(allocs) - int64(allocsRecycled); c.stalls && saved < int64(incidents)/2 {
				t.Errorf("recycling saved %d allocations over %d incidents: stalls were not reused", saved, incidents)
			}
			if !bytes.Equal(got, want) {
				i := 0
				for i < len(got) && i < len(want) && got[i] == want[i] {
					i++
				}
				from := bytes.LastIndexByte(want[:i], '\n') + 1
				t.Fatalf("%d incidents; recycled differ from line %d:\n got %.600s\nwant %.600s", incidents,
					bytes.Count(want[:i], []byte{'\n'})+1, got[from:], want[from:])
			}
		})
	}
}
