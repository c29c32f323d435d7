package correlate_test

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/event"
)

// The records below are what the kernel side sends for a pod whose
// lookups cross a node: queries and answers named by the kernel's query id
// (QID), and a drop record where a packet was freed.

const (
	podNS  = 4026532453 // the asking pod's network namespace
	nodeNS = 4026532177 // the node's, where its DNS is NATed
	msec   = uint64(time.Millisecond)
	base   = 1_000 * uint64(time.Second) // CLOCK_MONOTONIC of the first record
)

var (
	podSock = netip.MustParseAddrPort("10.244.0.12:53611")
	dnsVIP  = netip.MustParseAddrPort("10.96.0.10:53")
)

// query is a QUERY record: qid, sent at base+at, asking name.
func query(qid, at uint64, src netip.AddrPort, id, qtype uint16) *event.Event {
	e := &event.Event{Kind: event.KindQuery, Flags: event.FlagSender, QID: qid, TimeNs: base + at, NetNS: podNS, PID: 9937,
		Packet: event.Tuple{Src: src, Dst: dnsVIP, Proto: 17}, Tier: event.TierTracepoint}
	copy(e.Comm[:], "getent")
	e.DNS.Valid, e.DNS.ID, e.DNS.QType = true, id, qtype
	e.DNS.SetQName("checkout.shop.svc.cluster.local")
	return e
}

func answer(qid, at uint64) *event.Event {
	return &event.Event{Kind: event.KindAnswer, QID: qid, TimeNs: base + at, Flags: event.FlagResponse}
}

// drop is a DROP record: the kernel freed query qid in the node's
// namespace, for reason 1 at address 0x1000.
func drop(qid, at uint64, ct event.CT) *event.Event {
	return &event.Event{Kind: event.KindDrop, QID: qid, TimeNs: base + at, NetNS: nodeNS, Reason: 1, Location: 0x1000, CT: ct}
}

// config names reason 1 and the address 0x1000 as a kernel with drop
// reasons would, and puts base at a fixed wall time.
func config(onIncident func(*correlate.Incident)) correlate.Config {
	return correlate.Config{
		ReasonName: func(v uint32) string { return map[uint32]string{1: "NETFILTER_DROP"}[v] },
		Symbol: func(addr uint64) (string, uint64, bool) {
			if addr >= 0x1000 && addr < 0x1100 {
				return "nf_hook_slow", addr - 0x1000 + 0x7d, true
			}
			return "", 0, false
		},
		Wall: func(mono uint64) time.Time {
			return time.Date(2026, 11, 30, 15, 2, 27, 0, time.UTC).Add(time.Duration(mono - base))
		},
		OnIncident: onIncident,
	}
}

// A firewall rule drops a lookup's A query; glibc waits out its 5 s
// timeout and resends it, answered. The correlator reports the stall once
// the retry's attempt is over, with what the query died of.
func Example() {
	c := correlate.New(config(func(inc *correlate.Incident) {
		fmt.Printf("%s %s %s: stalled %.0f ms, retried %v\n", inc.Cause, inc.QName, inc.QType, *inc.StallMs, inc.Retried)
		for _, p := range inc.Lost {
			fmt.Printf("  lost %s id %d: %s %s\n", p.QType, p.ID, p.Cause, p.DropSite())
		}
		fmt.Printf("  sibling %s answered %v\n", inc.Sibling.QType, inc.Sibling.Answered)
	}))
	c.Handle(query(1, 0, podSock, 0x1a2b, dns.TypeA))
	c.Handle(query(2, msec/10, podSock, 0x1a2c, dns.TypeAAAA))
	c.Handle(drop(1, msec/5, event.CT{})) // no conntrack entry: a NOTRACK path
	c.Handle(answer(2, msec))
	c.Tick(base + 300*msec) // the drop is decided a quarter second after it

	c.Handle(query(3, 5000*msec, podSock, 0x1a2b, dns.TypeA)) // the retry
	c.Handle(answer(3, 5001*msec))
	c.Tick(base + 5500*msec)
	fmt.Printf("queries %d, lost %d\n", c.Stats().Queries, c.Stats().Lost)
	// Output:
	// rule_drop checkout.shop.svc.cluster.local A: stalled 5000 ms, retried true
	//   lost A id 6699: rule_drop NETFILTER_DROP at nf_hook_slow+0x7d in netns 4026532177
	//   sibling AAAA answered true
	// queries 3, lost 1
}

// A lookup that loses its AAAA in two attempts is one incident: glibc's
// second attempt resends A (answered) and then AAAA, lost again; its third
// attempt is answered. The stall runs from the first lost query to the
// third attempt, and every lost packet is in it.
func ExampleCorrelator_Handle() {
	var incidents []*correlate.Incident
	c := correlate.New(config(func(inc *correlate.Incident) { incidents = append(incidents, inc) }))
	qid := uint64(0)
	for _, at := range []uint64{0, 5000 * msec} {
		qid += 2
		c.Handle(query(qid-1, at, podSock, 7, dns.TypeA))
		c.Handle(answer(qid-1, at+msec))
		c.Handle(query(qid, at+2*msec, podSock, 8, dns.TypeAAAA))
		c.Handle(drop(qid, at+2*msec+msec/10, event.CT{}))
		c.Tick(base + at + 300*msec)
	}
	fresh := netip.MustParseAddrPort("10.244.0.12:40002") // glibc's third attempt: new sockets
	c.Handle(query(5, 10000*msec, fresh, 7, dns.TypeA))
	c.Handle(answer(5, 10001*msec))
	c.Handle(query(6, 10002*msec, fresh, 8, dns.TypeAAAA))
	c.Handle(answer(6, 10003*msec))
	c.Tick(base + 10500*msec)

	for _, inc := range incidents {
		fmt.Printf("%s at %s: %d packets lost, stalled %.0f ms, retry %s id %d from %s\n", inc.Cause,
			inc.Time.Format("15:04:05.000"), len(inc.Lost), *inc.StallMs, inc.Retry.QType, inc.Retry.ID, inc.Retry.Src)
	}
	fmt.Printf("incidents %d, lost queries %d\n", len(incidents), c.Stats().Lost)
	// Output:
	// rule_drop at 15:02:27.002: 2 packets lost, stalled 9998 ms, retry A id 7 from 10.244.0.12:40002
	// incidents 1, lost queries 2
}

// counters are the kernel's conntrack counters of the node, as deltas
// since tracing began: one packet refused at insertion.
type counters struct{}

func (counters) Delta(ns uint32) (ctstats.Counters, bool) {
	return ctstats.Counters{InsertFailed: 1, Drop: 1}, ns == nodeNS
}

// Two pods' queries race for the same SNAT mapping in the node's
// conntrack: the loser's entry was never confirmed and netfilter dropped
// it, and the kernel counted one insert_failed. Attributed says what the
// correlator explained of the kernel's counters; Close ends what is in
// progress.
func ExampleCorrelator_Attributed() {
	cfg := config(func(inc *correlate.Incident) {
		fmt.Printf("%s/%s, won by %s (%s)\n", inc.Cause, *inc.Race, inc.Winner.Src, inc.Winner.Comm)
	})
	cfg.Counters = counters{}
	c := correlate.New(cfg)
	other := netip.MustParseAddrPort("10.244.0.11:33808")
	snat := netip.MustParseAddrPort("10.96.100.1:10001")
	backend := netip.MustParseAddrPort("10.96.100.11:53")
	c.Handle(query(1, 0, other, 1, dns.TypeA))
	c.Handle(query(2, msec/100, podSock, 2, dns.TypeA))
	winner := event.CT{Ptr: 0xb, Status: event.IPSConfirmed, Orig: event.Tuple{Src: other, Dst: dnsVIP, Proto: 17},
		Reply: event.Tuple{Src: backend, Dst: snat, Proto: 17}}
	loser := event.CT{Ptr: 0xa, Orig: event.Tuple{Src: podSock, Dst: dnsVIP, Proto: 17},
		Reply: event.Tuple{Src: backend, Dst: snat, Proto: 17}}
	d := drop(2, msec/50, loser)
	d.Flags |= event.FlagWinner
	d.Winner, d.WinnerQID = winner, 1
	c.Handle(d)
	c.Handle(answer(1, msec))
	c.Tick(base + 300*msec)
	c.Close(base + 6000*msec) // the lost query's stall, not retried
	fmt.Printf("explained in the node: %+v\n", c.Attributed()[nodeNS])
	// Output:
	// insert_race/reply_clash, won by 10.244.0.11:33808 (getent)
	// explained in the node: {InsertFailed:1 Drop:1 ClashResolve:0}
}

// An incident as one JSON line, as the tracer's --json output writes it.
func ExampleIncident_AppendJSON() {
	c := correlate.New(config(func(inc *correlate.Incident) {
		fmt.Println(string(inc.AppendJSON(nil)))
	}))
	c.Handle(query(1, 0, podSock, 42, dns.TypeAAAA))
	c.Close(base + 6000*msec) // unanswered for a whole resolver timeout: lost
	// Output:
	// {"type":"incident","id":1,"time":"2026-11-30T15:02:27Z","cause":"no_reply","race":null,"qname":"checkout.shop.svc.cluster.local","qtype":"AAAA","netns":4026532453,"pid":9937,"comm":"getent","src":"10.244.0.12:53611","dst":"10.96.0.10:53","stall_ms":null,"retried":false,"retry":null,"lost":[{"qtype":"AAAA","id":42,"cause":"no_reply","cpu":0}],"sibling":null,"winner":null,"tier":"tracepoint"}
}

// A query type is a number inside; it is written as its mnemonic, or per
// RFC 3597 when it has none.
func ExampleQType() {
	fmt.Println(correlate.QType(dns.TypeAAAA), correlate.QType(65280))
	var t correlate.QType
	_ = t.UnmarshalText([]byte("HTTPS"))
	fmt.Println(uint16(t))
	// Output:
	// AAAA TYPE65280
	// 65
}
