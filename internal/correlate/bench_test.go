package correlate_test

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

const (
	benchPod   = 4026532001
	benchNames = 1000 // distinct names asked
	benchGap   = 5000 // ns between queries: 200,000 queries/s
)

var benchVIP = netip.MustParseAddrPort("10.96.0.10:53")

// BenchmarkHandle is the correlator's cost of one answered query at
// 200,000 queries/s from glibc-like sockets (A and AAAA on one socket, 1,000
// names): its QUERY and ANSWER records, and the 100 ms tick. One b.N is one
// query. The warm-up runs past the MaxQueries cap, so every query also
// evicts the oldest, as on a node that busy.
func BenchmarkHandle(b *testing.B) {
	names := make([]event.DNS, benchNames)
	for i := range names {
		names[i].SetQName(fmt.Sprintf("svc-%03d.ns-%02d.svc.cluster.local", i, i%17))
		names[i].Valid = true
	}
	c := correlate.New(correlate.Config{})
	var q, a event.Event
	run := func(n uint64) {
		t := 1e12 + n*benchGap
		sock := n / 2
		q = event.Event{Kind: event.KindQuery, Flags: event.FlagSender, QID: n + 1, TimeNs: t, NetNS: benchPod, DNS: names[sock%benchNames],
			Packet: event.Tuple{Src: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(sock >> 16), byte(sock >> 8)}), uint16(1024+sock%60000)), Dst: benchVIP, Proto: 17}}
		q.DNS.ID, q.DNS.QType = uint16(n), 1+27*uint16(n&1)
		c.Handle(&q)
		a = event.Event{Kind: event.KindAnswer, QID: n + 1, TimeNs: t + 40000, Flags: event.FlagResponse}
		c.Handle(&a)
		if n%20000 == 0 {
			c.Tick(t)
		}
	}
	testutil.BenchStream(b, 2*correlate.DefaultMaxQueries, run)
	st := c.Stats()
	if st.Answered != st.Queries {
		b.Fatalf("stream not answered: %+v", st)
	}
	b.ReportMetric(float64(st.Evicted)/float64(st.Queries), "evicted/query")
}

// BenchmarkInFlight is the heap a query in flight costs (unanswered, up to
// the MaxQueries cap).
func BenchmarkInFlight(b *testing.B) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := correlate.New(correlate.Config{})
	var e event.Event
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		e = event.Event{Kind: event.KindQuery, Flags: event.FlagSender, QID: uint64(i) + 1, TimeNs: 1e12 + uint64(i)*1000, NetNS: benchPod,
			Packet: event.Tuple{Src: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 16), byte(i >> 8)}), uint16(1024+i%60000)), Dst: benchVIP, Proto: 17}}
		e.DNS.Valid, e.DNS.ID, e.DNS.QType = true, uint16(i), 1
		e.DNS.SetQName(fmt.Sprintf("q%08x.perf.test", i))
		c.Handle(&e)
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	st := c.Stats()
	b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/1e6, "heap-MB")
	b.ReportMetric((float64(after.HeapInuse)-float64(before.HeapInuse))/float64(max(st.InFlight, 1)), "B/query")
	b.ReportMetric(float64(st.InFlight), "in-flight")
	runtime.KeepAlive(c)
}

// BenchmarkDropFlood is the correlator's cost of one query in an unpaced
// flood the node cannot keep up with (bench's dns-loopback): every query
// has its own name and socket, one in six is dropped on its way (the
// softirq backlog full) and becomes a local_drop stall, the rest are
// answered. 200,000 queries/s, the 100 ms tick, incidents handed to a
// no-op OnIncident. One b.N is one query.
func BenchmarkDropFlood(b *testing.B) {
	var incidents int
	c := correlate.New(correlate.Config{OnIncident: func(*correlate.Incident) { incidents++ }})
	sock := func(n uint64) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(1024+n%60000))
	}
	testutil.BenchStream(b, 2*correlate.DefaultMaxQueries, floodStream(c, sock, 6, 2, 0))
	// A stall is written when the cap makes room (longer runs) or at
	// QueryTTL; its lost query is counted at once.
	st := c.Stats()
	if st.Lost == 0 {
		b.Fatalf("no drop became a lost query: the stream is wrong: %+v", st)
	}
	b.ReportMetric(float64(incidents)/float64(st.Queries), "incidents/query")
}

// floodStream is the stream of a flood benchmark: query n, from socket
// sock(n) to 127.0.0.1:53, asks a name of its own (distinct for 5 s of
// flood: none is taken for a retry); every dropEvery-th query is dropped
// (with reason and location), the others answered; and the reader's
// 100 ms tick.
func floodStream(c *correlate.Correlator, sock func(uint64) netip.AddrPort, dropEvery uint64, reason uint32,
	location uint64) func(uint64) {
	names := make([]string, 1<<20)
	for i := range names {
		names[i] = fmt.Sprintf("q%08x.perf.test", i)
	}
	server := netip.MustParseAddrPort("127.0.0.1:53")
	var q, r event.Event
	return func(n uint64) {
		t := 1e12 + n*benchGap
		q = event.Event{Kind: event.KindQuery, Flags: event.FlagSender, QID: n + 1, TimeNs: t, NetNS: benchPod, PID: 4242, Cgroup: 1,
			Packet: event.Tuple{Src: sock(n), Dst: server, Proto: 17}}
		copy(q.Comm[:], "dnsperf")
		q.DNS.Valid, q.DNS.ID, q.DNS.QType = true, uint16(n), 1
		q.DNS.SetQName(names[n%uint64(len(names))])
		c.Handle(&q)
		if n%dropEvery == 0 {
			r = event.Event{Kind: event.KindDrop, QID: n + 1, TimeNs: t + 2000, NetNS: benchPod, Reason: reason,
				Location: location, Packet: q.Packet}
		} else {
			r = event.Event{Kind: event.KindAnswer, QID: n + 1, TimeNs: t + 40000, Flags: event.FlagResponse}
		}
		c.Handle(&r)
		if n%20000 == 0 {
			c.Tick(t)
		}
	}
}

// BenchmarkRcvbufFlood is the correlator's share of bench's dns-loopback
// flood as the tracer records it (queries freed at the server's full
// receive buffer, each a local_drop stall of its own): one client socket,
// a new name each query, every third query dropped with its reason and
// location (its symbol looked up as the session looks it up), every
// incident made a JSON line the way the session's writer makes it. One b.N
// is one query.
func BenchmarkRcvbufFlood(b *testing.B) {
	var line []byte
	var incidents int
	c := correlate.New(correlate.Config{
		// A stall no retry follows closes once its resolver's timeout and
		// its query's life have passed, and its incident is held
		// ForwarderGrace more (a forwarder's upstream loss may still come
		// to explain it): scaled down, so the stream's 0.7 s writes
		// incidents at the rate a flood's hours would.
		ResolverTimeout: 50 * time.Millisecond,
		QueryTTL:        100 * time.Millisecond,
		ForwarderGrace:  50 * time.Millisecond,
		ReasonName:      func(uint32) string { return "SOCKET_RCVBUFF" },
		Symbol:          func(a uint64) (string, uint64, bool) { return "udp_queue_rcv_one_skb", a & 0xfff, true },
		OnIncident: func(inc *correlate.Incident) {
			incidents++
			line = append(inc.AppendJSON(line[:0]), '\n')
		},
	})
	client := netip.MustParseAddrPort("127.0.0.1:38658")
	run := floodStream(c, func(uint64) netip.AddrPort { return client }, 3, 6, 0xffffffff81a3c437)
	testutil.BenchStream(b, 2*correlate.DefaultMaxQueries, run)
	if st := c.Stats(); st.Lost == 0 || incidents == 0 {
		b.Fatalf("no drop became an incident: the stream is wrong: %+v, %d incidents", st, incidents)
	}
	b.ReportMetric(float64(incidents)/float64(c.Stats().Queries), "incidents/query")
}

// BenchmarkForwarderFlood is the correlator's cost of one pod lookup
// behind a node-local cache that loses upstream queries: 64 pods ask the
// cache (an address AddrOwner gives its namespace) 100 names, 100,000
// lookups/s, and the cache asks the cluster DNS VIP for each. One in seven
// upstream queries is dropped; the cache resends it one second later, and
// that and the pod's query are answered then. Every cache incident has
// other pods' queries for its question open while it waits (awaited's
// walk), and every pod's late answer names it. One b.N is one lookup (2
// or 3 queries).
func BenchmarkForwarderFlood(b *testing.B) {
	var incidents int
	c, run, warm := forwarderFlood(func(*correlate.Incident) { incidents++ })
	testutil.BenchStream(b, 2*warm, run)
	st := c.Stats()
	if st.Lost == 0 || incidents == 0 {
		b.Fatalf("the stream is wrong: %+v, %d incidents", st, incidents)
	}
	b.ReportMetric(float64(incidents)/float64(st.Queries), "incidents/query")
}

// forwarderFlood is BenchmarkForwarderFlood's stream: its correlator,
// one lookup's records (n is the lookup), and how many lookups until the
// first retries come.
func forwarderFlood(onIncident func(*correlate.Incident)) (*correlate.Correlator, func(uint64), uint64) {
	const (
		pods       = 64
		gap        = 10_000        // ns between lookups
		retryAfter = 1_000_000_000 // ns: the cache's resend
		cacheNS    = 4026533000
	)
	cache := netip.MustParseAddrPort("169.254.20.10:53")
	names := make([]event.DNS, 100)
	for i := range names {
		names[i].SetQName(fmt.Sprintf("svc-%03d.ns-%02d.svc.cluster.local", i, i%17))
		names[i].Valid, names[i].QType = true, 1
	}
	c := correlate.New(correlate.Config{
		AddrOwner:      func(a netip.Addr) (uint32, bool) { return cacheNS, a == cache.Addr() },
		ForwarderGrace: 500 * time.Millisecond,
		OnIncident:     onIncident,
	})
	dropped := func(n uint64) bool { return n%7 == 0 }
	var e event.Event
	query := func(qid, t uint64, ns, pid uint32, src, dst netip.AddrPort, name uint64, id uint16) {
		e = event.Event{Kind: event.KindQuery, Flags: event.FlagSender, QID: qid, TimeNs: t, NetNS: ns, PID: pid,
			Packet: event.Tuple{Src: src, Dst: dst, Proto: 17}, DNS: names[name%uint64(len(names))]}
		e.DNS.ID = id
		c.Handle(&e)
	}
	answer := func(qid, t uint64) {
		e = event.Event{Kind: event.KindAnswer, QID: qid, TimeNs: t, Flags: event.FlagResponse}
		c.Handle(&e)
	}
	pod := func(n uint64) (uint32, netip.AddrPort) {
		p := n % pods
		return benchPod + uint32(p), netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, byte(p)}), uint16(1024+n/pods%60000))
	}
	upstream := func(n uint64) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 1, 2}), uint16(1024+n%60000))
	}
	run := func(n uint64) {
		t := 1e12 + n*gap
		if m := n - retryAfter/gap; n >= retryAfter/gap && dropped(m) {
			query(3*m+3, t, cacheNS, 219, upstream(m), benchVIP, m, uint16(m))
			answer(3*m+3, t+40000)
			answer(3*m+1, t+50000)
		}
		ns, src := pod(n)
		query(3*n+1, t, ns, 1000+uint32(n%pods), src, cache, n, uint16(n))
		query(3*n+2, t+20000, cacheNS, 219, upstream(n), benchVIP, n, uint16(n))
		if dropped(n) {
			e = event.Event{Kind: event.KindDrop, QID: 3*n + 2, TimeNs: t + 30000, NetNS: cacheNS, Reason: 2,
				Packet: event.Tuple{Src: upstream(n), Dst: benchVIP, Proto: 17}}
			c.Handle(&e)
		} else {
			answer(3*n+2, t+40000)
			answer(3*n+1, t+50000)
		}
		if n%10000 == 0 { // the reader's 100 ms tick
			c.Tick(t)
		}
	}
	return c, run, retryAfter / gap
}
