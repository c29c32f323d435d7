package trace_test

import (
	"encoding/binary"
	"sync"
	"testing"
	"unsafe"

	"github.com/dnsrace/dnsrace/internal/bpf"
	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/event"
)

// hop is one record of a query's path through the lab's node, as the
// tracepoint tier reports it.
type hop struct {
	kind     event.Kind
	netns    uint32
	answer   bool // the answer's skb and direction
	dst      [4]byte
	ct       bool // the node's confirmed conntrack entry is attached
	response bool
}

var (
	benchPod, benchVIP, benchBackend = [4]byte{10, 244, 0, 10}, [4]byte{10, 96, 0, 10}, [4]byte{10, 96, 100, 11}
	hops                             = [...]hop{
		{kind: event.KindXmit, netns: 1, dst: benchVIP},                         // leaves the pod
		{kind: event.KindRecv, netns: 2, dst: benchVIP},                         // node's bridge port
		{kind: event.KindXmit, netns: 2, dst: benchBackend, ct: true},           // DNATed toward the backend
		{kind: event.KindRecv, netns: 3, dst: benchBackend},                     // dns namespace
		{kind: event.KindXmit, netns: 3, answer: true, dst: benchBackend},       // the answer leaves
		{kind: event.KindRecv, netns: 2, answer: true, dst: benchBackend},       // node
		{kind: event.KindXmit, netns: 2, answer: true, dst: benchVIP, ct: true}, // reverse NAT
		{kind: event.KindRecv, netns: 1, answer: true, dst: benchVIP},           // received in the pod
	}
)

// BenchmarkReadPath is the user-space cost of one ring buffer record as the
// session's reader pays it: probe.Tracer.Read decodes into one reused
// Event, Session.read takes the mutex and hands it to the correlator, and
// the 100 ms ticker runs Tick. The stream is 200,000 answered queries/s,
// 8 records each (the path through the lab's node). The ring buffer read
// itself (cilium/ebpf's ringbuf reader, a few loads per record) is not
// included.
func BenchmarkReadPath(b *testing.B) {
	msg := []byte("\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" +
		"\x0akubernetes\x07default\x03svc\x07cluster\x05local\x00\x00\x01\x00\x01")
	var recs [len(hops)]bpf.DnsraceEvent
	raws := make([][]byte, len(hops))
	for i, h := range hops {
		r := &recs[i]
		r.Kind, r.Tier, r.Netns = uint8(h.kind), uint8(event.TierTracepoint), 4026532000+h.netns
		r.DnsLen = uint16(copy(r.Dns[:], msg))
		if h.answer {
			r.Dns[2] |= 0x80
		}
		r.Pkt.Family, r.Pkt.Proto = 4, 17
		if h.ct {
			r.Ct.Status = event.IPSConfirmed | event.IPSDstNAT
			r.Ct.Orig.Family, r.Ct.Orig.Proto, r.Ct.Reply.Family, r.Ct.Reply.Proto = 4, 17, 4, 17
			copy(r.Ct.Orig.Saddr[:], benchPod[:])
			copy(r.Ct.Orig.Daddr[:], benchVIP[:])
			copy(r.Ct.Reply.Saddr[:], benchBackend[:])
			copy(r.Ct.Reply.Daddr[:], benchPod[:])
			r.Ct.Orig.Dport, r.Ct.Reply.Sport = 53, 53
		}
		raws[i] = unsafe.Slice((*byte)(unsafe.Pointer(r)), unsafe.Sizeof(*r))
	}
	// patch writes query n's fields into record i.
	patch := func(i int, n uint64, t uint64) {
		h, r := hops[i], &recs[i]
		port := uint16(1024 + n%60000)
		r.Ts = t + uint64(i)*20000
		r.Skb = 0xffff888000000000 + n%(1<<20)*4096
		if h.answer {
			r.Skb += 2048
			copy(r.Pkt.Saddr[:], h.dst[:])
			copy(r.Pkt.Daddr[:], benchPod[:])
			r.Pkt.Sport, r.Pkt.Dport = 53, port
		} else {
			copy(r.Pkt.Saddr[:], benchPod[:])
			copy(r.Pkt.Daddr[:], h.dst[:])
			r.Pkt.Sport, r.Pkt.Dport = port, 53
		}
		if h.ct {
			r.Ct.Ptr = 0xffff889000000000 + n%(1<<20)*320
			r.Ct.Orig.Sport, r.Ct.Reply.Dport = port, port
		}
		binary.BigEndian.PutUint16(r.Dns[0:], uint16(n))
	}

	var (
		mu sync.Mutex
		e  event.Event
	)
	c := correlate.New(correlate.Config{})
	run := func(n uint64) {
		q, i := n/uint64(len(hops)), int(n%uint64(len(hops)))
		t := 1e12 + q*5000
		patch(i, q, t)
		if err := event.Decode(raws[i], &e); err != nil {
			b.Fatal(err)
		}
		mu.Lock()
		c.Handle(&e)
		mu.Unlock()
		if n%160000 == 0 { // the session's 100 ms ticker
			mu.Lock()
			c.Tick(t)
			mu.Unlock()
		}
	}
	// Warm up to steady state: past the MaxQueries cap.
	var n uint64
	for ; n < 2*correlate.DefaultMaxQueries*uint64(len(hops)); n++ {
		run(n)
	}
	b.ReportAllocs()
	for b.Loop() {
		run(n)
		n++
	}
	b.StopTimer()
	if st := c.Stats(); st.Answered < st.Queries/2 {
		b.Fatalf("queries not answered: the stream is wrong: %+v", st)
	}
}
