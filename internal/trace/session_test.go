package trace

import (
	"net/netip"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/event"
)

type nodeCounters map[uint32]ctstats.Counters

func (n nodeCounters) Delta(ns uint32) (ctstats.Counters, bool) { c, ok := n[ns]; return c, ok }

// TestTicksRunAtTheRecordsTime: a reader that has fallen behind the kernel
// classifies a drop only once it has read the records that follow it by
// ClassifyDelay. Here the loser's drop is read a second after it happened,
// and the record naming the flow that won its reply tuple comes 20 ms
// after it in the ring: a tick on the clock's time between the two would
// have found the drop long due and explained it without its winner.
func TestTicksRunAtTheRecordsTime(t *testing.T) {
	const (
		node, podA, podB = 1, 2, 3
		ms               = uint64(time.Millisecond)
	)
	var (
		vip     = netip.MustParseAddrPort("10.96.0.10:53")
		backend = netip.MustParseAddrPort("10.244.1.5:53")
		srcA    = netip.MustParseAddrPort("10.244.0.10:6000")
		srcB    = netip.MustParseAddrPort("10.244.0.11:5000")
		snat    = netip.MustParseAddrPort("10.0.0.1:10001")
	)
	s := &Session{counts: map[string]int{}, ctNS: map[uint32]bool{}, outq: make(chan outBatch, 16)}
	s.corr = correlate.New(correlate.Config{
		Counters:   nodeCounters{node: {InsertFailed: 1, Drop: 1}},
		ReasonName: func(uint32) string { return "NETFILTER_DROP" },
		Symbol:     func(uint64) (string, uint64, bool) { return "nf_hook_slow", 0x7d, true },
		OnIncident: s.incident,
	})
	qid := uint64(0)
	query := func(at uint64, ns uint32, src netip.AddrPort, id uint16) uint64 {
		qid++
		e := &event.Event{Kind: event.KindQuery, Flags: event.FlagSender, QID: qid, TimeNs: at, NetNS: ns, Tier: event.TierTracepoint,
			Packet: event.Tuple{Src: src, Dst: vip, Proto: 17}}
		e.DNS.Valid, e.DNS.ID, e.DNS.QType = true, id, 1
		e.DNS.SetQName("svc-00.lab.test")
		s.handle(e)
		return qid
	}
	// other is another lookup's record, answered at once.
	other := func(at uint64, port uint16) {
		q := query(at, node, netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), port), port)
		s.handle(&event.Event{Kind: event.KindAnswer, QID: q, TimeNs: at, Flags: event.FlagResponse})
	}
	entry := func(ptr uint64, src netip.AddrPort, confirmed bool) event.CT {
		ct := event.CT{Ptr: ptr, Orig: event.Tuple{Src: src, Dst: vip, Proto: 17},
			Reply: event.Tuple{Src: backend, Dst: snat, Proto: 17}}
		if confirmed {
			ct.Status = event.IPSConfirmed
		}
		return ct
	}

	t0 := monoNow()
	other(t0, 40000)        // the reader's first tick, on time
	time.Sleep(time.Second) // the reader falls a second behind
	a := query(t0+50*ms, podA, srcA, 1)
	w := query(t0+60*ms, podB, srcB, 7)
	s.handle(&event.Event{Kind: event.KindAnswer, QID: w, TimeNs: t0 + 70*ms, Flags: event.FlagResponse})
	s.handle(&event.Event{Kind: event.KindDrop, QID: a, TimeNs: t0 + 100*ms, NetNS: node, Reason: 1, Location: 1,
		CT: entry(0xa, srcA, false)})
	other(t0+110*ms, 40001) // a tick is due here
	s.handle(&event.Event{Kind: event.KindWinner, QID: a, TimeNs: t0 + 120*ms, NetNS: node, Flags: event.FlagWinner,
		Winner: entry(0xb, srcB, true), WinnerQID: w})
	other(t0+600*ms, 40002)
	r := query(t0+5100*ms, podA, srcA, 1) // glibc's retry ends the stall
	s.handle(&event.Event{Kind: event.KindAnswer, QID: r, TimeNs: t0 + 5110*ms, Flags: event.FlagResponse})
	s.tick(t0 + 5600*ms) // once the retry's attempt is over (MinRetryGap)

	var incs []*correlate.Incident
	for len(s.outq) > 0 {
		incs = append(incs, (<-s.outq).incidents...)
	}
	if len(incs) != 1 {
		for _, inc := range incs {
			t.Logf("%s %s %v", inc.Cause, inc.QName, inc.Src)
		}
		t.Fatalf("%d incidents, want 1", len(incs))
	}
	inc := incs[0]
	if inc.Cause != correlate.CauseInsertRace || inc.Race == nil || *inc.Race != correlate.RaceReplyClash ||
		inc.Winner == nil || inc.Winner.Src != srcB {
		t.Errorf("cause %s race %v winner %+v: want an insert_race, reply_clash, won by %s", inc.Cause, inc.Race, inc.Winner, srcB)
	}
}
