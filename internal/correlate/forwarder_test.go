package correlate

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsrace/dnsrace/internal/event"
)

// A cache pod (fwdNS, holding cacheAddr) forwards the pods' questions to
// the VIP from one query port, as dnsmasq does; its lost upstream query
// is the pods' stall.

const fwdNS = 300

var (
	cacheAddr = netip.MustParseAddrPort("10.244.0.250:53")
	fwdSrc    = netip.MustParseAddrPort("10.244.0.250:5301")
)

func newForwarderHarness(t *testing.T) *harness {
	return newHarnessWith(t, nil, func(c *Config) {
		c.AddrOwner = func(a netip.Addr) (uint32, bool) { return fwdNS, a == cacheAddr.Addr() }
		c.ForwarderGrace = 500 * time.Millisecond
	})
}

// send sends a QUERY record from pid in ns for svc-00.lab.test and returns
// its qid.
func (h *harness) send(t uint64, ns uint32, pid uint32, src, dst netip.AddrPort, id, qtype uint16) uint64 {
	return h.sendName(t, ns, pid, src, dst, id, qtype, "svc-00.lab.test")
}

// sendName is send for the question name.
func (h *harness) sendName(t uint64, ns uint32, pid uint32, src, dst netip.AddrPort, id, qtype uint16, name string) uint64 {
	h.qid++
	e := &event.Event{Kind: event.KindQuery, Flags: event.FlagSender, QID: h.qid, TimeNs: t, NetNS: ns, CPU: uint16(h.qid % 2),
		Packet: event.Tuple{Src: src, Dst: dst, Proto: 17}, Tier: event.TierFentry, PID: pid}
	e.DNS.Valid, e.DNS.ID, e.DNS.QType = true, id, qtype
	e.DNS.SetQName(name)
	h.c.Handle(e)
	return h.qid
}

// ticks ticks every 100 ms from from to to.
func (h *harness) ticks(from, to uint64) {
	for at := from; at <= to; at += 100 * ms {
		h.c.Tick(at)
	}
}

const (
	podPID = 4242
	fwdPID = 219
)

// One pod lookup, glibc style (one socket, the same ids at its retry);
// the cache's upstream A is dropped, then its resend answered at the
// pod's retry. The pod's incident is upstream_lost and names the cache's
// incident, which lists the pod back.
func TestPodStallNamesForwarderLoss(t *testing.T) {
	h := newForwarderHarness(t)
	pod := srcA
	qa := h.send(0, podA, podPID, pod, cacheAddr, 1, dns.TypeA)
	h.answer(ms, h.send(200*uint64(time.Microsecond), podA, podPID, pod, cacheAddr, 2, dns.TypeAAAA))
	up := h.send(ms, fwdNS, fwdPID, fwdSrc, vip, 100, dns.TypeA)
	h.handle(drop(2*ms, up, reasonOtherhost, 3, event.CT{}))
	h.ticks(100*ms, 5*sec-100*ms)
	h.answer(5*sec+2*ms, h.send(5*sec+ms, fwdNS, fwdPID, fwdSrc, vip, 100, dns.TypeA))
	h.answer(5*sec+3*ms, h.send(5*sec, podA, podPID, pod, cacheAddr, 1, dns.TypeA))
	h.ticks(5*sec+100*ms, 7*sec)
	h.c.Close(8 * sec)
	_ = qa
	var podInc, fwdInc *Incident
	for _, inc := range h.incidents {
		switch inc.NetNS {
		case podA:
			podInc = inc
		case fwdNS:
			fwdInc = inc
		}
	}
	if podInc == nil || fwdInc == nil || len(h.incidents) != 2 {
		t.Fatalf("%d incidents, want the pod's and the cache's", len(h.incidents))
	}
	if podInc.Cause != CauseUpstreamLost || podInc.Upstream == nil || podInc.Upstream.Incident != fwdInc.ID || podInc.Upstream.Cause != CauseLocalDrop {
		t.Errorf("pod incident: cause %s upstream %+v; want upstream_lost naming incident %d (local_drop)", podInc.Cause, podInc.Upstream, fwdInc.ID)
	}
	if len(fwdInc.Downstream) != 1 || fwdInc.Downstream[0].Incident != podInc.ID {
		t.Errorf("cache incident lists askers %+v, want the pod's incident %d", fwdInc.Downstream, podInc.ID)
	}
}

// Go's resolver in two pods: A and AAAA each on a socket of their own, new
// sockets and ids at the retry, never answered (the cache's upstream
// queries keep being dropped). Each timeout waited out is one incident of
// its pod with both queries, whatever order the losses are found in.
func TestGoPodsBehindForwarderOneIncidentPerTimeout(t *testing.T) {
	h := newForwarderHarness(t)
	port := uint16(40000)
	sock := func(ns uint32) netip.AddrPort {
		port++
		a := srcA.Addr()
		if ns == podB {
			a = srcB.Addr()
		}
		return netip.AddrPortFrom(a, port)
	}
	id := uint16(2000)
	fwdID := map[uint16]uint16{dns.TypeA: 100, dns.TypeAAAA: 101}
	for _, at := range []uint64{0, 5 * sec} {
		for i, ns := range []uint32{podA, podB} {
			t0 := at + uint64(i)*3*ms
			// the AAAA goroutine may send first
			h.send(t0, ns, podPID, sock(ns), cacheAddr, id+1, dns.TypeAAAA)
			h.send(t0+300*uint64(time.Microsecond), ns, podPID, sock(ns), cacheAddr, id, dns.TypeA)
			id += 2
		}
		// the cache asks (or asks again) once, both pods' questions joined
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
			up := h.send(at+ms, fwdNS, fwdPID, fwdSrc, vip, fwdID[qt], qt)
			h.handle(drop(at+2*ms, up, reasonOtherhost, 3, event.CT{}))
		}
		h.ticks(at+100*ms, at+5*sec-100*ms)
	}
	h.ticks(10*sec, 12*sec)
	h.c.Close(13 * sec)
	perPod := map[uint32][]*Incident{}
	for _, inc := range h.incidents {
		perPod[inc.NetNS] = append(perPod[inc.NetNS], inc)
	}
	for _, ns := range []uint32{podA, podB} {
		if got := perPod[ns]; len(got) != 2 {
			for _, inc := range got {
				t.Logf("pod %d incident %d: lost %v retried %v", ns, inc.ID, lostIDs(inc), inc.Retried)
			}
			t.Errorf("pod %d: %d incidents, want 2 (one per timeout)", ns, len(got))
		}
		for _, inc := range perPod[ns] {
			if len(inc.Lost) != 2 || inc.Cause != CauseUpstreamLost {
				t.Errorf("pod %d incident %d: %s, lost %v; want upstream_lost with A and AAAA", ns, inc.ID, inc.Cause, lostIDs(inc))
			}
		}
	}
}

// A second pod asks the same question late in the cache's stall; the
// cache's resend answers only the first pod, and the second waits out its
// resolver's timeout, closing seconds after the cache's stall ended. The
// cache's incident waits for it, and lists both pods.
func TestForwarderIncidentWaitsForLateAsker(t *testing.T) {
	h := newForwarderHarness(t)
	h.answer(ms, h.send(200*uint64(time.Microsecond), podA, podPID, srcA, cacheAddr, 2, dns.TypeAAAA))
	h.send(0, podA, podPID, srcA, cacheAddr, 1, dns.TypeA)
	up := h.send(ms, fwdNS, fwdPID, fwdSrc, vip, 100, dns.TypeA)
	h.handle(drop(2*ms, up, reasonOtherhost, 3, event.CT{}))
	h.ticks(100*ms, 4900*ms)
	h.send(4900*ms+ms/2, podB, podPID, srcB, cacheAddr, 7, dns.TypeA)
	h.answer(5*sec+2*ms, h.send(5*sec+ms, fwdNS, fwdPID, fwdSrc, vip, 100, dns.TypeA))
	h.answer(5*sec+3*ms, h.send(5*sec, podA, podPID, srcA, cacheAddr, 1, dns.TypeA))
	h.ticks(5*sec+100*ms, 9800*ms)
	for _, inc := range h.incidents {
		if inc.NetNS == fwdNS {
			t.Fatalf("the cache's incident %d was emitted by 9.8 s, while the query of pod B that joined its stall was open", inc.ID)
		}
	}
	h.answer(9900*ms+2*ms, h.send(9900*ms+ms/2, podB, podPID, srcB, cacheAddr, 7, dns.TypeA))
	h.ticks(9900*ms, 11*sec)
	var fwdInc *Incident
	pods := map[uint32]uint64{}
	for _, inc := range h.incidents {
		if inc.NetNS == fwdNS {
			fwdInc = inc
			continue
		}
		pods[inc.NetNS] = inc.ID
		if inc.Cause != CauseUpstreamLost {
			t.Errorf("pod %d incident: %s, want upstream_lost", inc.NetNS, inc.Cause)
		}
	}
	if fwdInc == nil || len(pods) != 2 {
		t.Fatalf("%d incidents by 11 s, want the cache's and one per pod", len(h.incidents))
	}
	var listed []uint64
	for _, a := range fwdInc.Downstream {
		listed = append(listed, a.Incident)
	}
	if len(listed) != 2 || !slices.Contains(listed, pods[podA]) || !slices.Contains(listed, pods[podB]) {
		t.Errorf("cache incident lists %v, want both pods' incidents %v", listed, pods)
	}
	h.c.Close(12 * sec)
}

// Nothing awaits a forwarder's incident whose question no client still
// has open: it is emitted ForwarderGrace after its stall.
func TestForwarderIncidentNotHeldWithoutAskers(t *testing.T) {
	h := newForwarderHarness(t)
	up := h.send(ms, fwdNS, fwdPID, fwdSrc, vip, 100, dns.TypeA)
	h.handle(drop(2*ms, up, reasonOtherhost, 3, event.CT{}))
	h.send(5*sec, podB, podPID, srcB, vip, 9, dns.TypeA) // another pod asks the VIP itself: no asker
	h.ticks(100*ms, 5*sec-100*ms)
	h.answer(5*sec+2*ms, h.send(5*sec+ms, fwdNS, fwdPID, fwdSrc, vip, 100, dns.TypeA))
	h.ticks(5*sec, 5700*ms)
	if len(h.incidents) != 1 || h.incidents[0].NetNS != fwdNS {
		t.Fatalf("%d incidents by 5.7 s, want the cache's, emitted ForwarderGrace after its stall", len(h.incidents))
	}
	h.c.Close(12 * sec)
}

// An incident looks for clients that joined its stall only where some
// other client asked its namespace its question: a flood of stalls that
// nobody waits on (one client asking its own namespace, pods asking the
// VIP) compares no incident with another query. Comparing each incident
// with every stall in progress made a drop-heavy stream fifty times as
// costly (BenchmarkDropPath).
func TestAwaitedLooksOnlyWhereAsked(t *testing.T) {
	h := newForwarderHarness(t)
	loopback := netip.MustParseAddrPort("127.0.0.1:53")
	// 20 s of lookups, a tick every 100 ms: when the first incidents are
	// due (12 s), later stalls are open and later queries in flight.
	const (
		lookups = 10000
		gap     = 2 * ms
	)
	for n := range uint64(lookups) {
		at := n * gap
		port := uint16(1024 + n%60000)
		// one client asking its own namespace, and pods asking the VIP
		self := h.sendName(at, podA, podPID, netip.AddrPortFrom(loopback.Addr(), port), loopback, port, dns.TypeA, fmt.Sprintf("q%d.self.test", n))
		pod := h.sendName(at, podB+uint32(n%64), podPID, netip.AddrPortFrom(srcB.Addr(), port), vip, port, dns.TypeA, fmt.Sprintf("svc-%d.lab.test", n%50))
		for _, q := range []uint64{self, pod} {
			if n%4 == 0 {
				h.handle(drop(at+ms/10, q, reasonOtherhost, 3, event.CT{}))
			} else {
				h.answer(at+ms/10, q)
			}
		}
		if n%50 == 0 {
			h.c.Tick(at)
		}
	}
	h.ticks(lookups*gap, 35*sec)
	if len(h.incidents) < lookups/4 {
		t.Fatalf("%d incidents from %d lost lookups of each kind", len(h.incidents), lookups/4)
	}
	if h.c.awaitLooks != 0 {
		t.Errorf("%d incidents that nobody else asked about compared with %d queries", len(h.incidents), h.c.awaitLooks)
	}
	h.c.Close(36 * sec)
}

// Go's resolver in a pod behind the cache: the cache's upstream A is
// lost and its resend answered just as the pod's resolver gives up, so
// the cache's answer lands in the pod's socket as it closes and is freed
// there (NOT_SPECIFIED, udp_destruct_common: TestTraceCacheRace on 6.12
// under load). The pod's stall is still the cache's lost query.
func TestAnswerFreedAtCloseBehindForwarder(t *testing.T) {
	h := newForwarderHarness(t)
	sockA := netip.AddrPortFrom(srcA.Addr(), 40001)
	sockAAAA := netip.AddrPortFrom(srcA.Addr(), 40002)
	h.answer(ms, h.send(0, podA, podPID, sockAAAA, cacheAddr, 2001, dns.TypeAAAA))
	qa := h.send(300*uint64(time.Microsecond), podA, podPID, sockA, cacheAddr, 2000, dns.TypeA)
	up := h.send(ms, fwdNS, fwdPID, fwdSrc, vip, 100, dns.TypeA)
	h.handle(drop(2*ms, up, reasonOtherhost, 3, event.CT{}))
	h.ticks(100*ms, 5*sec-100*ms)
	h.answer(5*sec-ms/2, h.send(5*sec-ms, fwdNS, fwdPID, fwdSrc, vip, 100, dns.TypeA))
	h.handle(&event.Event{Kind: event.KindDrop, QID: qa, TimeNs: 5*sec + ms, NetNS: podA, Location: locSocketClose, Flags: event.FlagResponse})
	// the retry, on a new socket with a new id, answered from the cache
	h.answer(5*sec+3*ms, h.send(5*sec+2*ms, podA, podPID, netip.AddrPortFrom(srcA.Addr(), 40003), cacheAddr, 2002, dns.TypeA))
	h.ticks(5*sec+100*ms, 7*sec)
	h.c.Close(8 * sec)
	var pod []*Incident
	for _, inc := range h.incidents {
		if inc.NetNS == podA {
			pod = append(pod, inc)
		}
	}
	if len(pod) != 1 {
		t.Fatalf("%d incidents of the pod, want 1", len(pod))
	}
	if inc := pod[0]; inc.Cause != CauseUpstreamLost || inc.Upstream == nil {
		t.Errorf("pod incident: cause %s, upstream %+v; want upstream_lost naming the cache's query", inc.Cause, inc.Upstream)
	}
}

// A cache that asks each question from a new port (dnsmasq without
// --query-port): its lost query stalls two pods (Go's resolver), and the
// first pod's retry makes it ask again, from another port, before the
// second pod's retry. The second pod's stall is still the lost query's,
// though the cache's latest query of the question is not.
func TestForwarderNewPortPerQuery(t *testing.T) {
	h := newForwarderHarness(t)
	port := uint16(41000)
	sock := func(a netip.AddrPort) netip.AddrPort { port++; return netip.AddrPortFrom(a.Addr(), port) }
	fwdPort := func(p uint16) netip.AddrPort { return netip.AddrPortFrom(fwdSrc.Addr(), p) }

	h.send(0, podA, podPID, sock(srcA), cacheAddr, 3000, dns.TypeA)
	lost := h.send(ms, fwdNS, fwdPID, fwdPort(30001), vip, 100, dns.TypeA)
	h.handle(drop(2*ms, lost, reasonOtherhost, 3, event.CT{}))
	h.send(sec, podB, podPID, sock(srcB), cacheAddr, 3001, dns.TypeA) // joins the lost query
	h.ticks(100*ms, 5*sec-100*ms)
	// pod A's retry; the cache asks again from another port
	retryA := h.send(5*sec, podA, podPID, sock(srcA), cacheAddr, 3002, dns.TypeA)
	h.answer(5*sec+2*ms, h.send(5*sec+ms, fwdNS, fwdPID, fwdPort(30002), vip, 101, dns.TypeA))
	h.answer(5*sec+3*ms, retryA)
	h.ticks(5*sec+100*ms, 6*sec-100*ms)
	// pod B's retry, answered the same way
	retryB := h.send(6*sec, podB, podPID, sock(srcB), cacheAddr, 3003, dns.TypeA)
	h.answer(6*sec+2*ms, h.send(6*sec+ms, fwdNS, fwdPID, fwdPort(30003), vip, 102, dns.TypeA))
	h.answer(6*sec+3*ms, retryB)
	h.ticks(6*sec+100*ms, 8*sec)
	h.c.Close(9 * sec)

	var fwd *Incident
	pods := map[uint32]*Incident{}
	for _, inc := range h.incidents {
		switch inc.NetNS {
		case fwdNS:
			fwd = inc
		case podA, podB:
			pods[inc.NetNS] = inc
		}
	}
	if fwd == nil || len(pods) != 2 {
		t.Fatalf("incidents: cache %v, pods %d; want the cache's and one per pod", fwd != nil, len(pods))
	}
	for ns, inc := range pods {
		if inc.Cause != CauseUpstreamLost || inc.Upstream == nil || inc.Upstream.Incident != fwd.ID {
			t.Errorf("pod %d: cause %s, upstream %+v; want upstream_lost naming the cache's incident %d", ns, inc.Cause, inc.Upstream, fwd.ID)
		}
	}
}
