package overhead

import (
	"fmt"
	"io"
	"net/netip"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/event"
)

// MemoryResult is the correlator's footprint with many unanswered queries.
type MemoryResult struct {
	Queries    int     `json:"queries_fed"`
	MaxQueries int     `json:"max_queries"`
	InFlight   int     `json:"in_flight"`
	Evicted    uint64  `json:"evicted"`
	NsPerEvent float64 `json:"ns_per_event"`
	// HeapInuse after a GC with the correlator alive.
	Heap uint64 `json:"heap_inuse_bytes"`
	// BytesPerQuery is (Heap - heap before) / InFlight.
	BytesPerQuery float64 `json:"bytes_per_query"`
	RSS           uint64  `json:"rss_bytes"`
	PeakRSS       uint64  `json:"peak_rss_bytes"`
}

// SyntheticQuery fills e as the QUERY record of pod query i: its own
// query id, source port, DNS id and name, never answered.
func SyntheticQuery(e *event.Event, i int, netns uint32, t uint64) {
	*e = event.Event{
		Kind: event.KindQuery, Tier: event.TierTracepoint, TimeNs: t, NetNS: netns, CPU: uint16(i & 1),
		QID: uint64(i) + 1,
		Packet: event.Tuple{
			Src:   netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 24), byte(i >> 16)}), uint16(1024+i%60000)),
			Dst:   netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 0, 10}), 53),
			Proto: 17,
		},
	}
	e.DNS.Valid, e.DNS.ID, e.DNS.QType = true, uint16(i), 1
	var name [len("q00000000.perf.test")]byte
	copy(name[:], "q00000000.perf.test")
	putHex(name[1:9], uint32(i))
	e.DNS.SetQName(string(name[:]))
}

// Memory feeds n synthetic unanswered queries, 1 µs apart (all within one
// QueryTTL, so none expires), to a correlator with the given cap (0: the
// default) and measures the heap and this process's RSS.
func Memory(n, maxQueries int) MemoryResult {
	debug.FreeOSMemory()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	c := correlate.New(correlate.Config{MaxQueries: maxQueries})
	var e event.Event
	start := time.Now()
	t0 := uint64(1e12)
	for i := range n {
		SyntheticQuery(&e, i, 4026531840, t0+uint64(i)*1000)
		c.Handle(&e)
	}
	el := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&after)
	st := c.Stats()
	r := MemoryResult{Queries: n, MaxQueries: maxQueries, InFlight: st.InFlight, Evicted: st.Evicted,
		NsPerEvent: float64(el.Nanoseconds()) / float64(n), Heap: after.HeapInuse}
	if r.MaxQueries == 0 {
		r.MaxQueries = correlate.DefaultMaxQueries
	}
	if st.InFlight > 0 {
		r.BytesPerQuery = float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / float64(st.InFlight)
	}
	r.RSS, r.PeakRSS, _ = procMem(0)
	runtime.KeepAlive(c)
	return r
}

// WriteMemoryText prints a MemoryResult.
func WriteMemoryText(w io.Writer, r MemoryResult) {
	fmt.Fprintf(w, "fed %d unanswered queries (%.0f ns/event): %d in flight (cap %d), %d evicted\n",
		r.Queries, r.NsPerEvent, r.InFlight, r.MaxQueries, r.Evicted)
	fmt.Fprintf(w, "heap in use %.1f MB (%.0f B per query in flight), RSS %.1f MB, peak RSS %.1f MB\n",
		float64(r.Heap)/1e6, r.BytesPerQuery, float64(r.RSS)/1e6, float64(r.PeakRSS)/1e6)
}
