package trace_test

import (
	"encoding/binary"
	"testing"
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
