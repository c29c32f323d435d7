package correlate_test

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/event"
)

// Namespaces and addresses of the benchmark's synthetic node: a pod, the
// node that DNATs the VIP to a backend, and the dns namespace.
const (
	benchPod, benchNode, benchDNS = 4026532001, 4026532002, 4026532003
	benchNames                    = 1000 // distinct names asked
	benchGap                      = 5000 // ns between query pairs: 200,000 queries/s
)

var (
	benchVIP     = netip.MustParseAddrPort("10.96.0.10:53")
	benchBackend = netip.MustParseAddrPort("10.96.100.11:53")
	benchPodAddr = netip.MustParseAddr("10.244.0.10")
)

// mix generates the events of a busy node in the order the tracepoint tier
// sees them: glibc's A and AAAA from one socket, each leaving the pod's
// veth, crossing the node (received, DNATed and confirmed on the way out)
// and arriving in the dns namespace; the answers come back the same way
// and are received in the pod. 16 events per query pair.
type mix struct {
	names [benchNames]event.DNS
	pair  int
	step  int
	t     uint64
}

func newMix() *mix {
	m := &mix{t: 1e12}
	for i := range m.names {
		m.names[i].SetQName(fmt.Sprintf("svc-%03d.ns-%02d.svc.cluster.local", i, i%17))
		m.names[i].Valid = true
	}
	return m
}

const eventsPerPair = 16

// next fills e with the next event of the mix.
func (m *mix) next(e *event.Event) {
	p, s := m.pair, m.step
	m.step++
	if m.step == eventsPerPair {
		m.step = 0
		m.pair++
		m.t += benchGap
	}
	q := s / 8   // 0: A, 1: AAAA
	hop := s % 8 // 0-3 query, 4-7 answer
	src := netip.AddrPortFrom(benchPodAddr, uint16(1024+p%60000))
	ct := uint64(0xffff_8881_0000_0000) + uint64(p%(1<<20))*320
	*e = event.Event{Tier: event.TierTracepoint, TimeNs: m.t + uint64(s)*100, CPU: uint16(q)}
	e.DNS = m.names[p%benchNames]
	e.DNS.ID = uint16(p * 2)
	e.DNS.QType = 1
	if q == 1 {
		e.DNS.QType = 28
		e.DNS.ID++
	}
	skb := uint64(0xffff_8880_0000_0000) + uint64(p%(1<<22))*2048 + uint64(q)*1024
	if hop >= 4 {
		skb += 512
		e.DNS.Response = true
	}
	e.Skb = skb
	confirmed := event.CT{Ptr: ct + uint64(q)*160, Status: event.IPSConfirmed | event.IPSDstNAT,
		Orig:  event.Tuple{Src: src, Dst: benchVIP, Proto: 17},
		Reply: event.Tuple{Src: benchBackend, Dst: src, Proto: 17}}
	switch hop {
	case 0: // query leaves the pod
		e.Kind, e.NetNS, e.PID = event.KindXmit, benchPod, 4242
		e.Packet = event.Tuple{Src: src, Dst: benchVIP, Proto: 17}
	case 1: // received on the node's bridge port
		e.Kind, e.NetNS = event.KindRecv, benchNode
		e.Packet = event.Tuple{Src: src, Dst: benchVIP, Proto: 17}
	case 2: // DNATed, confirmed, queued toward the backend
		e.Kind, e.NetNS, e.CT = event.KindXmit, benchNode, confirmed
		e.Packet = event.Tuple{Src: src, Dst: benchBackend, Proto: 17}
	case 3: // arrives in the dns namespace
		e.Kind, e.NetNS = event.KindRecv, benchDNS
		e.Packet = event.Tuple{Src: src, Dst: benchBackend, Proto: 17}
	case 4: // the answer leaves the server
		e.Kind, e.NetNS = event.KindXmit, benchDNS
		e.Packet = event.Tuple{Src: benchBackend, Dst: src, Proto: 17}
	case 5:
		e.Kind, e.NetNS = event.KindRecv, benchNode
		e.Packet = event.Tuple{Src: benchBackend, Dst: src, Proto: 17}
	case 6: // reverse NAT toward the pod
		e.Kind, e.NetNS, e.CT = event.KindXmit, benchNode, confirmed
		e.Packet = event.Tuple{Src: benchVIP, Dst: src, Proto: 17}
	case 7: // received in the pod: answered
		e.Kind, e.NetNS = event.KindRecv, benchPod
		e.Packet = event.Tuple{Src: benchVIP, Dst: src, Proto: 17}
	}
}

// BenchmarkHandle is the correlator's cost per event at 200,000 answered
// queries/s (16 events per A/AAAA pair), Tick every 100 ms of event time as
// the session does. The first pass warms the maps up to steady state
// (queries are kept QueryTTL, capped by MaxQueries). ns/op includes
// generating the event (see BenchmarkMixOnly).
func BenchmarkHandle(b *testing.B) {
	c := correlate.New(correlate.Config{})
	m := newMix()
	var e event.Event
	tick := func() {
		if m.t >= lastTick+uint64(100*time.Millisecond) {
			lastTick = m.t
			c.Tick(m.t)
		}
	}
	// Warm up: 1.5 s of traffic, past the MaxQueries cap, so eviction runs.
	lastTick = m.t
	for range 300_000 * eventsPerPair {
		m.next(&e)
		c.Handle(&e)
		tick()
	}
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		m.next(&e)
		c.Handle(&e)
		tick()
	}
	b.StopTimer()
	st := c.Stats()
	b.ReportMetric(float64(st.InFlight), "in-flight")
	if st.Answered == 0 {
		b.Fatal("no query answered: the mix is wrong")
	}
}

var lastTick uint64

// BenchmarkMixOnly is the cost of generating one event of the mix, to
// subtract from BenchmarkHandle.
func BenchmarkMixOnly(b *testing.B) {
	m := newMix()
	var e event.Event
	b.ReportAllocs()
	for b.Loop() {
		m.next(&e)
	}
}

// BenchmarkInFlight feeds unanswered queries, each for its own name, 1 µs
// apart (none expires), one per op, and reports the heap kept per query in
// flight and how many were evicted. -benchtime 1000000x is the documented
// memory figure. (Names are built before the timer; their own memory is
// measured out.)
func BenchmarkInFlight(b *testing.B) {
	names := make([]event.DNS, b.N)
	for i := range names {
		names[i].SetQName(fmt.Sprintf("q%08x.perf.test", i))
		names[i].Valid, names[i].QType, names[i].ID = true, 1, uint16(i)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := correlate.New(correlate.Config{})
	var e event.Event
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		e = event.Event{Kind: event.KindXmit, Tier: event.TierTracepoint, TimeNs: 1e12 + uint64(i)*1000, NetNS: benchPod,
			Skb:    0xffff_8880_0000_0000 + uint64(i)*256,
			Packet: event.Tuple{Src: netip.AddrPortFrom(benchPodAddr, uint16(1024+i%60000)), Dst: benchVIP, Proto: 17}}
		e.DNS = names[i]
		c.Handle(&e)
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	st := c.Stats()
	b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/1e6, "heap-MB")
	b.ReportMetric((float64(after.HeapInuse)-float64(before.HeapInuse))/float64(max(st.InFlight, 1)), "B/query")
	b.ReportMetric(float64(st.InFlight), "in-flight")
	b.ReportMetric(float64(st.Evicted), "evicted")
	runtime.KeepAlive(c)
	runtime.KeepAlive(names)
}
