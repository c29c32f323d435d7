package trace

import (
	"bytes"
	"encoding/json"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/event"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// golden compares got with testdata/name (or writes it with -update).
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to create it)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

var t0 = time.Date(2026, 11, 30, 15, 2, 27, 195e6, time.UTC)

func str(s string) *string  { return &s }
func ms(f float64) *float64 { return &f }

// incidents is one of each kind a session writes.
func incidents() []*correlate.Incident {
	pod := netip.MustParseAddrPort("10.244.0.12:53611")
	vip := netip.MustParseAddrPort("10.96.0.10:53")
	a, aaaa := correlate.QType(dns.TypeA), correlate.QType(dns.TypeAAAA)
	race := &correlate.Incident{Type: "incident", ID: 1, Time: t0, Cause: correlate.CauseInsertRace, Race: str(correlate.RaceReplyClash),
		QName: "svc-02.lab.test", QType: a, NetNS: 4026532453, PID: 9937, Comm: "getent", Cgroup: 77, Src: pod, Dst: vip,
		StallMs: ms(5002.4), Retried: true, Retry: &correlate.Retry{QType: a, ID: 50852, Src: pod, Dst: vip}, NodeNetNS: 4026532177,
		Lost: []correlate.Packet{{QType: a, ID: 50852, Cause: correlate.CauseInsertRace, Race: correlate.RaceReplyClash,
			Reason: "NETFILTER_DROP", Location: "nf_hook_slow+0x7d", NetNS: 4026532177, CPU: 1}},
		Sibling: &correlate.Sibling{QType: aaaa, ID: 50853, GapUs: 86, CPUs: [2]int{1, 1}, Answered: true},
		Winner: &correlate.Flow{Src: netip.MustParseAddrPort("10.244.0.11:33808"), Dst: vip,
			ReplySrc: netip.MustParseAddrPort("10.96.100.11:53"), ReplyDst: netip.MustParseAddrPort("10.96.100.1:10001"),
			NetNS: 4026532384, QName: "svc-01.lab.test", QType: aaaa, Comm: "getent", PID: 9930},
		Tier: "tracepoint", Pod: "checkout-7f9c4d-x2k8p", Namespace: "shop", Container: "app"}
	full := &correlate.Incident{Type: "incident", ID: 2, Time: t0.Add(-300 * time.Millisecond), Cause: correlate.CauseTableFull,
		QName: "kubernetes.default.svc.cluster.local", QType: aaaa, NetNS: 4026532500, Src: pod, Dst: vip, StallMs: ms(10004),
		Retried: true, Retry: &correlate.Retry{QType: aaaa, ID: 7, Src: pod, Dst: vip}, NodeNetNS: 4026532177,
		Lost: []correlate.Packet{{QType: aaaa, ID: 7, Cause: correlate.CauseTableFull, Reason: "NETFILTER_DROP", Location: "nf_hook_slow+0x7d", NetNS: 4026532177}},
		Tier: "fentry", Pod: "host"}
	unmatched := &correlate.Incident{Type: "incident", ID: 3, Time: t0.Add(2 * time.Second), Cause: correlate.CauseReplyUnmatched,
		QName: "svc-00.lab.test", QType: a, NetNS: 4026532600, Src: pod, Dst: vip,
		Lost: []correlate.Packet{{QType: a, ID: 9, Cause: correlate.CauseReplyUnmatched, Reason: "NO_SOCKET", Location: "__udp4_lib_rcv+0x3a0", NetNS: 4026532177}},
		Tier: "kprobe"}
	noReply := &correlate.Incident{Type: "incident", ID: 4, Time: t0.Add(3 * time.Second), Cause: correlate.CauseNoReply,
		QName: "svc-00.lab.test", QType: correlate.QType(65280), NetNS: 4026532600, Src: pod, Dst: vip, StallMs: ms(2500),
		Retried: true, Retry: &correlate.Retry{QType: correlate.QType(65280), ID: 10, Src: pod, Dst: vip},
		Lost: []correlate.Packet{{QType: correlate.QType(65280), ID: 10, Cause: correlate.CauseNoReply}}, Tier: "tracepoint"}
	// 5.10 has no drop reasons: the drop is known by where it was freed.
	noReason := &correlate.Incident{Type: "incident", ID: 5, Time: t0.Add(4 * time.Second), Cause: correlate.CauseInsertRace, Race: str(correlate.RaceReplyClash),
		QName: "svc-03.lab.test", QType: aaaa, NetNS: 4026532453, Src: pod, Dst: vip, NodeNetNS: 4026532177,
		Lost: []correlate.Packet{{QType: aaaa, ID: 11, Cause: correlate.CauseInsertRace, Race: correlate.RaceReplyClash,
			Location: "nf_hook_slow+0x93", NetNS: 4026532177}},
		Tier: "kprobe"}
	return []*correlate.Incident{race, full, unmatched, noReply, noReason}
}

func rescued(id uint64, at time.Time, pod string, netns uint32, race string) *correlate.Incident {
	return &correlate.Incident{Type: "incident", ID: id, Time: at, Cause: correlate.CauseClashResolved, Race: str(race),
		QName: "svc-00.lab.test", QType: correlate.QType(dns.TypeAAAA), NetNS: netns, StallMs: ms(0),
		Src: netip.MustParseAddrPort("10.244.0.10:40000"), Dst: netip.MustParseAddrPort("10.96.0.10:53"),
		NodeNetNS: 4026532177, Lost: []correlate.Packet{}, Tier: "tracepoint", Pod: pod, Namespace: map[bool]string{true: "web"}[pod != ""]}
}

// TestTextGolden: the text a person reads. Stalls come out in the order
// they started once no earlier stall is open; races the kernel rescued are
// summed up per pod or namespace every 10 s.
func TestTextGolden(t *testing.T) {
	var out bytes.Buffer
	w := NewTextWriter(&out, false)
	inc := incidents()
	w.Release(time.Time{}, t0) // starts the 10 s period
	// The race ends first but started after the table_full stall, which
	// is still open: it waits.
	w.Incident(inc[0])
	w.Incident(rescued(5, t0, "frontend-7d9f8-lp3xk", 4026532700, correlate.RaceSameTuple))
	w.Incident(rescued(6, t0, "frontend-7d9f8-lp3xk", 4026532700, correlate.RaceSameTuple))
	w.Incident(rescued(7, t0, "", 4026532800, correlate.RaceReplyClash))
	w.Release(inc[1].Time, t0.Add(5*time.Second))
	if out.Len() != 0 {
		t.Fatalf("written while an earlier stall was open:\n%s", out.String())
	}
	w.Incident(inc[1])
	w.Release(time.Time{}, t0.Add(6*time.Second))
	w.Incident(inc[2])
	w.Incident(inc[3])
	w.Incident(inc[4])
	w.Release(time.Time{}, t0.Add(11*time.Second)) // the 10 s summing-up
	w.Incident(rescued(8, t0.Add(12*time.Second), "frontend-7d9f8-lp3xk", 4026532700, correlate.RaceSameTuple))
	w.Close(t0.Add(13 * time.Second))
	golden(t, "incidents.txt", out.Bytes())

	// Every stall line by start time.
	var times []string
	for _, l := range strings.Split(out.String(), "\n") {
		if l != "" && l[0] != ' ' && !strings.Contains(l, "rescued") {
			times = append(times, l[:12])
		}
	}
	if !sort.StringsAreSorted(times) || len(times) != 5 {
		t.Errorf("stall headlines out of order: %v", times)
	}
}

// TestTextShowResolved lists each rescued race.
func TestTextShowResolved(t *testing.T) {
	var out bytes.Buffer
	w := NewTextWriter(&out, true)
	w.Incident(rescued(5, t0, "frontend-7d9f8-lp3xk", 4026532700, correlate.RaceSameTuple))
	w.Close(t0)
	golden(t, "rescued.txt", out.Bytes())
}

func summary() *Summary {
	return &Summary{Type: "summary", DurationS: 20.84, Incidents: map[string]int{correlate.CauseInsertRace: 16, correlate.CauseClashResolved: 3},
		Kernel:     ctstats.Counters{InsertFailed: 28, Drop: 29, ClashResolve: 3, Found: 600},
		Attributed: correlate.Attributed{InsertFailed: 28, Drop: 28, ClashResolve: 3},
		Mismatch:   []string{"drop: kernel 29, attributed 28"},
		Events:     2620, EventBytes: 461120, Queries: correlate.Stats{Queries: 276, Answered: 248, Lost: 28, InFlight: 0, StallsReportedEarly: 2},
		KernelFlows:     &KernelFlows{Started: 276, Answered: 248, Unanswered: 28},
		Namespaces:      []NamespaceSummary{{NetNS: 4026532177, Path: "/run/netns/dnsrace-node"}},
		Probes:          []ProbeSummary{{Hook: "kfree_skb", Tier: "tracepoint", Attached: true}, {Hook: "nf_conntrack_confirm", Tier: "none"}},
		RecursionMisses: map[string]uint64{"tp_kmem_cache_free": 3, "tp_kfree_skb": 1}}
}

func TestSummaryGolden(t *testing.T) {
	golden(t, "summary.txt", []byte(FormatSummary(summary())))
}

// TestJSONGolden pins the JSON contract: every incident field, names and
// formats, and the summary.
func TestJSONGolden(t *testing.T) {
	var out bytes.Buffer
	for _, inc := range incidents() {
		out.Write(append(inc.AppendJSON(nil), '\n')) // what the session's writer writes
	}
	WriteSummary(&out, summary(), true)
	golden(t, "incidents.jsonl", out.Bytes())

	// The fields of the first release's contract are all still there.
	var obj map[string]any
	if err := json.Unmarshal(bytes.SplitN(out.Bytes(), []byte("\n"), 2)[0], &obj); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"type", "id", "time", "cause", "race", "qname", "qtype", "netns", "pid", "comm", "cgroup",
		"src", "dst", "stall_ms", "retried", "retry", "node_netns", "lost", "sibling", "winner", "tier", "pod", "namespace", "container"} {
		if _, ok := obj[k]; !ok {
			t.Errorf("incident lacks %q", k)
		}
	}
	for k, want := range map[string]string{"src": "10.244.0.12:53611", "qtype": "A"} {
		if obj[k] != want {
			t.Errorf("%s = %v, want %q", k, obj[k], want)
		}
	}
	lost := obj["lost"].([]any)[0].(map[string]any)
	for _, k := range []string{"qtype", "id", "cause", "race", "reason", "location", "netns", "cpu"} {
		if _, ok := lost[k]; !ok {
			t.Errorf("lost packet lacks %q", k)
		}
	}
	winner := obj["winner"].(map[string]any)
	for _, k := range []string{"src", "dst", "reply_src", "reply_dst", "netns", "qname", "qtype"} {
		if _, ok := winner[k]; !ok {
			t.Errorf("winner lacks %q", k)
		}
	}
}

// records are a node's records for TestTextOneHeadlinePerLookup, fed to a
// real correlator and text writer the way a session feeds them.
type records struct {
	events []event.Event
	qid    uint64
}

// recBase is the records' CLOCK_MONOTONIC origin; the correlator's Wall
// puts it at t0.
const recBase = uint64(1e12)

var recVIP = netip.MustParseAddrPort("10.96.0.10:53")

// query sends a query at ms milliseconds and returns its qid.
func (l *records) query(ms float64, netns uint32, src string, name string, id, qtype uint16) uint64 {
	l.qid++
	e := event.Event{Kind: event.KindQuery, Flags: event.FlagSender, QID: l.qid, TimeNs: recBase + uint64(ms*1e6), NetNS: netns, CPU: 1,
		Packet: event.Tuple{Src: netip.MustParseAddrPort(src), Dst: recVIP, Proto: 17}, Tier: event.TierTracepoint, PID: 9937}
	copy(e.Comm[:], "getent")
	e.DNS.Valid, e.DNS.ID, e.DNS.QType = true, id, qtype
	e.DNS.SetQName(name)
	l.events = append(l.events, e)
	return l.qid
}

func (l *records) answer(ms float64, qid uint64) {
	l.events = append(l.events, event.Event{Kind: event.KindAnswer, QID: qid, TimeNs: recBase + uint64(ms*1e6), Flags: event.FlagResponse})
}

// ruleDrop: a firewall rule on the node drops the query (NETFILTER_DROP at
// nf_hook_slow, no conntrack entry: a NOTRACK path).
func (l *records) ruleDrop(ms float64, qid uint64) {
	l.events = append(l.events, event.Event{Kind: event.KindDrop, QID: qid, TimeNs: recBase + uint64(ms*1e6), NetNS: 4026532177,
		Reason: 1, Location: 1})
}

// run feeds the records in time order to a correlator, ticks it every
// 100 ms as the session's reader does, and hands each tick's incidents to
// a text writer with the correlator's OldestOpen, as the session's writer
// does. It returns the text.
func (l *records) run(end float64) string {
	var out bytes.Buffer
	w := NewTextWriter(&out, false)
	var closed []*correlate.Incident
	wall := func(mono uint64) time.Time { return t0.Add(time.Duration(mono - recBase)) }
	c := correlate.New(correlate.Config{
		ReasonName: func(v uint32) string { return map[uint32]string{1: "NETFILTER_DROP"}[v] },
		Symbol:     func(uint64) (string, uint64, bool) { return "nf_hook_slow", 0x7d, true },
		Wall:       wall,
		OnIncident: func(inc *correlate.Incident) { closed = append(closed, inc) },
	})
	sort.SliceStable(l.events, func(i, j int) bool { return l.events[i].TimeNs < l.events[j].TimeNs })
	hand := func(now uint64) {
		for _, inc := range closed {
			w.Incident(inc)
		}
		closed = nil
		var oldest time.Time
		if o := c.OldestOpen(); o != 0 {
			oldest = wall(o)
		}
		w.Release(oldest, wall(now))
	}
	next := 0
	for now := recBase; now <= recBase+uint64(end*1e6); now += uint64(100 * time.Millisecond) {
		for ; next < len(l.events) && l.events[next].TimeNs <= now; next++ {
			c.Handle(&l.events[next])
		}
		c.Tick(now)
		hand(now)
	}
	stop := recBase + uint64(end*1e6)
	c.Close(stop)
	hand(stop)
	w.Close(wall(stop))
	return out.String()
}

// TestTextOneHeadlinePerLookup: each stalled lookup is one headline, and
// the headlines come in the order the stalls started, though the stalls
// end (and are found) in another order. Three lookups stall:
//
//   - pod 4026532600 at 0.5 s: its A is never answered; that is known
//     only at glibc's retry, 5 s later;
//   - pod 4026532700 at 1 s: A dropped by a rule, resent 2.5 s later
//     (musl) and answered;
//   - pod 4026532453 at 2 s: A and AAAA both dropped by a rule; glibc's
//     second attempt, 5 s later, resends A (answered) and then AAAA,
//     dropped again; its third attempt, on new sockets, is answered: one
//     lookup, two timeouts waited, three packets lost.
func TestTextOneHeadlinePerLookup(t *testing.T) {
	const podA, podB, podC = 4026532453, 4026532600, 4026532700
	a, aaaa := dns.TypeA, dns.TypeAAAA
	l := &records{}

	l.query(500, podB, "10.244.0.20:41000", "svc-00.lab.test", 7, a) // never answered
	l.answer(501, l.query(500.1, podB, "10.244.0.20:41000", "svc-00.lab.test", 8, aaaa))
	l.answer(5501, l.query(5500, podB, "10.244.0.20:41000", "svc-00.lab.test", 7, a))

	l.ruleDrop(1000.05, l.query(1000, podC, "10.244.0.30:42000", "svc-01.lab.test", 9, a))
	l.answer(1001, l.query(1000.1, podC, "10.244.0.30:42000", "svc-01.lab.test", 10, aaaa))
	l.answer(3501, l.query(3500, podC, "10.244.0.30:42000", "svc-01.lab.test", 9, a))

	for _, at := range []float64{2000, 7000} {
		q := l.query(at, podA, "10.244.0.12:53611", "svc-02.lab.test", 100, a)
		if at == 2000 {
			l.ruleDrop(at+0.05, q)
		} else {
			l.answer(at+1, q)
		}
		l.ruleDrop(at+1.25, l.query(at+1.2, podA, "10.244.0.12:53611", "svc-02.lab.test", 101, aaaa))
	}
	l.answer(12001, l.query(12000, podA, "10.244.0.12:40002", "svc-02.lab.test", 100, a))
	l.answer(12003, l.query(12002, podA, "10.244.0.12:40003", "svc-02.lab.test", 101, aaaa))

	text := l.run(14000)
	golden(t, "lookups.txt", []byte(text))

	var heads []string
	for _, line := range strings.Split(text, "\n") {
		if line != "" && line[0] != ' ' {
			heads = append(heads, line)
		}
	}
	if len(heads) != 3 {
		t.Errorf("%d headlines, want 3, one per stalled lookup:\n%s", len(heads), strings.Join(heads, "\n"))
	}
	times := make([]string, len(heads))
	for i, h := range heads {
		times[i] = h[:12]
	}
	if !sort.StringsAreSorted(times) {
		t.Errorf("headlines out of the order the stalls started: %v", times)
	}
	if n := strings.Count(text, "    lost     "); n != 5 {
		t.Errorf("%d lost packets shown, want 5 (podA's three, podB's and podC's one each)", n)
	}
}

// TestTextTakeDone: the text writer hands back an incident (for reuse) only
// once it no longer reads it: a stall once written, a rescued race once
// summed up; a stall held for order is not handed back.
func TestTextTakeDone(t *testing.T) {
	var out bytes.Buffer
	w := NewTextWriter(&out, false)
	t0 := time.Unix(1764666698, 0).UTC()
	early := &correlate.Incident{Type: "incident", ID: 1, Time: t0, Cause: correlate.CauseInsertRace}
	late := &correlate.Incident{Type: "incident", ID: 2, Time: t0.Add(2 * time.Second), Cause: correlate.CauseInsertRace}
	rescued := &correlate.Incident{Type: "incident", ID: 3, Time: t0, Cause: correlate.CauseClashResolved}
	for _, inc := range []*correlate.Incident{late, early, rescued} {
		w.Incident(inc)
	}
	ids := func(incs []*correlate.Incident) (s []uint64) {
		for _, inc := range incs {
			s = append(s, inc.ID)
		}
		return s
	}
	// A stall that started between the two is still open: only the
	// early one is written.
	w.Release(t0.Add(time.Second), t0.Add(3*time.Second))
	if got := ids(w.TakeDone(nil)); !slices.Equal(got, []uint64{3, 1}) {
		t.Errorf("after the first release: %v, want [3 1] (the rescued race summed, the early stall written)", got)
	}
	if got := w.TakeDone(nil); len(got) != 0 {
		t.Errorf("taken twice: %v", ids(got))
	}
	w.Release(time.Time{}, t0.Add(4*time.Second))
	if got := ids(w.TakeDone(nil)); !slices.Equal(got, []uint64{2}) {
		t.Errorf("after the last release: %v, want [2]", got)
	}
	if n := strings.Count(out.String(), "insert_race"); n < 2 {
		t.Errorf("%d stalls written, want 2:\n%s", n, out.String())
	}
}
