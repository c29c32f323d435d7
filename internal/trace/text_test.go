package trace

import (
	"bytes"
	"encoding/json"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/ctstats"
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
