package trace_test

import (
	"encoding/binary"
	"testing"
	"time"
	"unsafe"

	"github.com/dnsrace/dnsrace/internal/bpf"
	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

func bytesOf[T any](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

// BenchmarkReadPath is the user-space cost of one answered query as the
// session's reader pays it: its QUERY and ANSWER records decoded into one
// reused Event and handed to the correlator, with the reader's 100 ms tick.
// The stream is 200,000 answered queries/s from one pod to the cluster DNS
// VIP. The ring buffer read itself (cilium/ebpf's ringbuf reader, a few
// loads per record) is not included. One b.N is one query (two records).
func BenchmarkReadPath(b *testing.B) {
	msg := []byte("\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" +
		"\x0akubernetes\x07default\x03svc\x07cluster\x05local\x00\x00\x01\x00\x01")
	var q bpf.DnsraceRecQuery
	q.H.Type, q.H.Tier, q.H.Netns = uint8(bpf.DnsraceRecTypeREC_QUERY), uint8(event.TierTracepoint), 4026532001
	q.T.Family, q.T.Proto, q.T.Dport = 4, 17, 53
	copy(q.T.Saddr[:], []byte{10, 244, 0, 10})
	copy(q.T.Daddr[:], []byte{10, 96, 0, 10})
	q.DnsLen = uint16(len(msg))
	query := append(append([]byte{}, bytesOf(&q)...), msg...)
	var a bpf.DnsraceRecAnswer
	a.H.Type, a.H.Tier, a.H.Netns, a.DnsFlags = uint8(bpf.DnsraceRecTypeREC_ANSWER), uint8(event.TierTracepoint), 4026532001, 0x8180
	answer := append([]byte{}, bytesOf(&a)...)

	var e event.Event
	c := correlate.New(correlate.Config{})
	run := func(n uint64) {
		t := 1e12 + n*5000
		binary.LittleEndian.PutUint64(query[8:], n+1) // qid
		binary.LittleEndian.PutUint64(query[0:], t)
		binary.LittleEndian.PutUint16(query[event.QuerySize-40+32:], uint16(1024+n%60000)) // sport
		binary.BigEndian.PutUint16(query[event.QuerySize:], uint16(n))                     // DNS id
		binary.LittleEndian.PutUint64(answer[8:], n+1)
		binary.LittleEndian.PutUint64(answer[0:], t+40000)
		for _, raw := range [][]byte{query, answer} {
			if err := event.Decode(raw, &e); err != nil {
				b.Fatal(err)
			}
			c.Handle(&e)
		}
		if n%20000 == 0 { // the reader's 100 ms tick
			c.Tick(t)
		}
	}
	testutil.BenchStream(b, 2*correlate.DefaultMaxQueries, run)
	if st := c.Stats(); st.Answered != st.Queries {
		b.Fatalf("queries not answered: the stream is wrong: %+v", st)
	}
}

// BenchmarkDropPath is the user-space cost of one lookup in a stream where
// 15% of the queries are dropped on the node, as the session's reader pays
// it: 100,000 lookups/s from pods to the cluster DNS VIP, each a socket of
// its own; an answered query is a QUERY and an ANSWER record, a dropped one
// a QUERY and a DROP record (SOCKET_RCVBUFF at the DNS pod's socket,
// decided after ClassifyDelay at the reader's 100 ms tick, when its stall
// opens). Its resolver resends it one second later (glibc with timeout:1:
// the same socket and DNS id), that resend is answered, and the stall
// closes at the next tick; its incident goes to an OnIncident that counts
// it and queues it, as the session's does, and is given back to the
// correlator (Recycle) at the tick after, as the session's writer hands
// it back once written. One b.N is one lookup: 2.3 records on average.
func BenchmarkDropPath(b *testing.B) {
	const (
		gap        = 10_000        // ns between lookups: 100,000/s
		retryAfter = 1_000_000_000 // ns: the resolver's timeout
		retryQID   = 1 << 40       // the resends' query ids start here
	)
	msg := []byte("\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" +
		"\x0akubernetes\x07default\x03svc\x07cluster\x05local\x00\x00\x01\x00\x01")
	pod, dnsPod := uint32(4026532001), uint32(4026532100)
	vip, backend := []byte{10, 96, 0, 10}, []byte{10, 244, 1, 5}

	var q rawQuery
	q.rec.H.Type, q.rec.H.Tier, q.rec.H.Netns = uint8(bpf.DnsraceRecTypeREC_QUERY), uint8(event.TierTracepoint), pod
	q.rec.T.Family, q.rec.T.Proto, q.rec.T.Dport = 4, 17, 53
	copy(q.rec.T.Daddr[:], vip)
	q.rec.DnsLen = uint16(copy(q.msg[:], msg))
	query := bytesOf(&q)[:event.QuerySize+len(msg)]

	var a bpf.DnsraceRecAnswer
	a.H.Type, a.H.Tier, a.H.Netns, a.DnsFlags = uint8(bpf.DnsraceRecTypeREC_ANSWER), uint8(event.TierTracepoint), pod, 0x8180
	answer := bytesOf(&a)

	// The drop at the DNS pod's full socket: the packet after DNAT, and
	// the node's confirmed entry.
	var d bpf.DnsraceRecEvent
	d.H.Type, d.H.Tier, d.H.Netns = uint8(bpf.DnsraceRecTypeREC_EVENT), uint8(event.TierTracepoint), dnsPod
	d.Kind, d.Reason, d.Location = uint8(bpf.DnsraceEvKindEV_DROP), 6, 0xffffffff81a3c437
	d.Pkt.Family, d.Pkt.Proto, d.Pkt.Dport = 4, 17, 53
	copy(d.Pkt.Daddr[:], backend)
	d.Ct.Ptr, d.Ct.Status = 0xffff888012345000, event.IPSConfirmed|event.IPSDstNAT
	d.Ct.Orig.Family, d.Ct.Orig.Proto, d.Ct.Orig.Dport = 4, 17, 53
	copy(d.Ct.Orig.Daddr[:], vip)
	d.Ct.Reply.Family, d.Ct.Reply.Proto, d.Ct.Reply.Sport = 4, 17, 53
	copy(d.Ct.Reply.Saddr[:], backend)
	drop := bytesOf(&d)[:event.EventNoWinnerSize]

	dropped := func(n uint64) bool { return n%20 < 3 }
	// lookup n's socket: a pod address and port of its own
	sock := func(n uint64) (addr [4]byte, port uint16) {
		return [4]byte{10, 244, byte(n >> 16), byte(n >> 8)}, uint16(1024 + n&0xff)
	}
	setQuery := func(n, qid, t uint64) {
		addr, port := sock(n)
		q.rec.H.Qid, q.rec.H.Ts = qid, t
		copy(q.rec.T.Saddr[:], addr[:])
		q.rec.T.Sport = port
		binary.BigEndian.PutUint16(q.msg[0:], uint16(n)) // DNS id
	}

	var e event.Event
	counts := map[string]int{}
	var closing, written []*correlate.Incident
	c := correlate.New(correlate.Config{
		ReasonName: func(uint32) string { return "SOCKET_RCVBUFF" },
		Symbol:     func(a uint64) (string, uint64, bool) { return "udp_queue_rcv_one_skb", a & 0xfff, true },
		Wall:       func(mono uint64) time.Time { return time.Unix(0, int64(mono)) },
		OnIncident: func(inc *correlate.Incident) {
			counts[inc.Cause]++
			closing = append(closing, inc)
		},
	})
	handle := func(raw []byte) {
		if err := event.Decode(raw, &e); err != nil {
			b.Fatal(err)
		}
		c.Handle(&e)
	}
	var records, lookups uint64
	run := func(n uint64) {
		lookups++
		t := 1e12 + n*gap
		if m := n - retryAfter/gap; n >= retryAfter/gap && dropped(m) {
			setQuery(m, retryQID+m, t)
			handle(query)
			a.H.Qid, a.H.Ts = retryQID+m, t+40000
			handle(answer)
			records += 2
		}
		setQuery(n, n+1, t)
		handle(query)
		if dropped(n) {
			addr, port := sock(n)
			d.H.Qid, d.H.Ts = n+1, t+20000
			copy(d.Pkt.Saddr[:], addr[:])
			d.Pkt.Sport = port
			d.Ct.Orig.Sport, d.Ct.Reply.Dport = port, port
			copy(d.Ct.Orig.Saddr[:], addr[:])
			copy(d.Ct.Reply.Daddr[:], addr[:])
			handle(drop)
		} else {
			a.H.Qid, a.H.Ts = n+1, t+40000
			handle(answer)
		}
		records += 2
		if n%10000 == 0 { // the reader's 100 ms tick
			for _, inc := range written {
				c.Recycle(inc)
			}
			c.Tick(t)
			written, closing = closing, written[:0]
		}
	}
	testutil.BenchStream(b, 2*retryAfter/gap, run)
	st := c.Stats()
	if st.Lost == 0 || st.StallsReportedEarly != 0 || counts[correlate.CauseLocalDrop] == 0 {
		b.Fatalf("the stream is wrong: %+v, incidents %v", st, counts)
	}
	b.ReportMetric(float64(records)/float64(lookups), "records/lookup")
}

// rawQuery is a QUERY record with room for its DNS message after it.
type rawQuery struct {
	rec bpf.DnsraceRecQuery
	msg [128]byte
}
