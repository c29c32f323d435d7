package perf

import (
	"testing"

	"github.com/miekg/dns"
)

func TestBuildQuery(t *testing.T) {
	b := make([]byte, 64)
	buildQuery(b, 0xbeef, 0x2a)
	var m dns.Msg
	if err := m.Unpack(b[:dnsQueryLen]); err != nil {
		t.Fatalf("unpacking the flood's query: %v", err)
	}
	if m.Id != 0xbeef || m.Response || len(m.Question) != 1 {
		t.Fatalf("header: %+v", m.MsgHdr)
	}
	q := m.Question[0]
	if q.Name != "q0000002a.perf.test." || q.Qtype != dns.TypeA || q.Qclass != dns.ClassINET {
		t.Errorf("question %+v", q)
	}
}

func TestProblems(t *testing.T) {
	ok := &Result{Capacity: []Step{{Rate: 2000, Seconds: 5, Received: 2000, Queries: 10000}}}
	if p := Problems(ok); len(p) != 0 {
		t.Errorf("clean run: %v", p)
	}
	lost := &Result{Capacity: []Step{{Rate: 2000, Seconds: 5, Received: 2000, Queries: 10000, Lost: 3}}}
	if p := Problems(lost); len(p) != 1 {
		t.Errorf("lost events: %v", p)
	}
	missed := &Result{Capacity: []Step{{Rate: 2000, Seconds: 5, Received: 2000, Queries: 9000}}}
	if p := Problems(missed); len(p) != 1 {
		t.Errorf("queries missed: %v", p)
	}
}

func TestProcSelf(t *testing.T) {
	if _, err := procCPU(0); err != nil {
		t.Fatal(err)
	}
	rss, hwm, err := procMem(0)
	if err != nil || rss == 0 || hwm < rss {
		t.Fatalf("rss %d hwm %d: %v", rss, hwm, err)
	}
}

func TestMemorySmall(t *testing.T) {
	r := Memory(5000, 1000)
	if r.InFlight != 1000 || r.Evicted != 4000 {
		t.Errorf("in flight %d, evicted %d; want 1000, 4000", r.InFlight, r.Evicted)
	}
}
