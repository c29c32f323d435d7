package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
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

// TestWriterHandsIncidentsBack: a flood of dropped lookups through the
// session's reader and writer as trace runs them, each tick's written
// incidents handed back to the reader, whose correlator reuses their
// stalls for later lookups: every dropped lookup is still written once,
// whole (a stall reused before its incident was written would show as a
// lookup twice and another missing). make test-race runs it under the race
// detector. In JSON and in text (which holds incidents to write them in
// order).
func TestWriterHandsIncidentsBack(t *testing.T) {
	for _, asJSON := range []bool{true, false} {
		t.Run(map[bool]string{true: "json", false: "text"}[asJSON], func(t *testing.T) {
			var out bytes.Buffer
			s := &Session{opts: Options{JSON: asJSON}, counts: map[string]int{}, refused: map[string]int{}, ctNS: map[uint32]bool{},
				outq: make(chan outBatch, outQueue), written: make(chan []*correlate.Incident, outQueue),
				cpq: make(chan func()), wdone: make(chan struct{})}
			s.buf = bufio.NewWriter(&out)
			if !asJSON {
				s.text = NewTextWriter(s.buf, false)
			}
			s.corr = correlate.New(correlate.Config{
				// stalls no retry follows close within 200 ms of records
				ResolverTimeout: 50 * time.Millisecond, QueryTTL: 100 * time.Millisecond, ForwarderGrace: 50 * time.Millisecond,
				ReasonName: func(uint32) string { return "SOCKET_RCVBUFF" },
				Symbol:     func(a uint64) (string, uint64, bool) { return "udp_queue_rcv_one_skb", a & 0xfff, true },
				Wall:       s.wall,
				OnIncident: s.incident,
			})
			go s.write()

			const (
				pod     = 4026532001
				lookups = 60000
				gap     = 20 * uint64(time.Microsecond) // 1.2 s of records, 12 ticks
			)
			server := netip.MustParseAddrPort("10.96.0.10:53")
			dropped := map[string]int{}
			t0 := uint64(1e12)
			for n := range uint64(lookups) {
				at := t0 + n*gap
				src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(n >> 16), byte(n >> 8)}), uint16(1024+n&0xff))
				q := &event.Event{Kind: event.KindQuery, Flags: event.FlagSender, QID: n + 1, TimeNs: at, NetNS: pod,
					Packet: event.Tuple{Src: src, Dst: server, Proto: 17}}
				name := fmt.Sprintf("q%05d.flood.test", n)
				q.DNS.Valid, q.DNS.ID, q.DNS.QType = true, uint16(n), 1
				q.DNS.SetQName(name)
				s.handle(q)
				if n%3 == 0 {
					dropped[name] = 0
					s.handle(&event.Event{Kind: event.KindDrop, QID: n + 1, TimeNs: at + 2000, NetNS: pod, Reason: 6,
						Location: 0xffffffff81a3c437, Packet: q.Packet})
				} else {
					s.handle(&event.Event{Kind: event.KindAnswer, QID: n + 1, TimeNs: at + 40000, Flags: event.FlagResponse})
				}
				if n%5000 == 0 {
					time.Sleep(time.Millisecond) // the writer catches up: its incidents come back
				}
			}
			end := t0 + lookups*gap + uint64(time.Second)
			s.tick(end)
			s.corr.Close(end)
			s.handOver(end, false)
			close(s.outq)
			<-s.wdone
			if s.text != nil {
				s.text.Close(s.wall(end))
			}
			if err := s.buf.Flush(); err != nil {
				t.Fatal(err)
			}

			written := 0
			if asJSON {
				for line := range strings.SplitSeq(strings.TrimSpace(out.String()), "\n") {
					var inc struct{ QName string }
					if err := json.Unmarshal([]byte(line), &inc); err != nil {
						t.Fatalf("line %q: %v", line, err)
					}
					if _, ok := dropped[inc.QName]; !ok {
						t.Fatalf("an incident for %q, which was not dropped", inc.QName)
					}
					dropped[inc.QName]++
					written++
				}
			} else {
				for _, m := range regexp.MustCompile(` (q[0-9]{5}\.flood\.test) `).FindAllStringSubmatch(out.String(), -1) {
					dropped[m[1]]++ // the headline's question
					written++
				}
			}
			for name, k := range dropped {
				if k != 1 {
					t.Fatalf("%s written %d times, want once (%d incidents for %d dropped lookups)", name, k, written, len(dropped))
				}
			}
			t.Logf("%d dropped lookups, each written once", len(dropped))
		})
	}
}
