package metrics_test

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/metrics"
)

// Scrape reads the text exposition at url into "name{labels}" -> value.
func Scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

func inc(cause, race, ns, pod string, stallMs float64) *correlate.Incident {
	i := &correlate.Incident{Cause: cause, Namespace: ns, Pod: pod, StallMs: &stallMs}
	if race != "" {
		i.Race = &race
	}
	return i
}

func TestMetrics(t *testing.T) {
	m := metrics.New(metrics.Config{PodLabels: true, MaxPods: 2}, metrics.Source{
		EventsLost: func() uint64 { return 3 },
		Missed:     func() map[string]uint64 { return map[string]uint64{"tp_kmem_cache_free": 2, "tp_kfree_skb": 0} },
		Probes: func() []metrics.Probe {
			return []metrics.Probe{{Hook: "nf_conntrack_confirm", Tier: "tracepoint", Attached: true}, {Hook: "udp_sendmsg", Tier: "fentry"}}
		},
		Conntrack: func() map[uint32]ctstats.Counters {
			return map[uint32]ctstats.Counters{4026532177: {InsertFailed: 28, Drop: 28, ClashResolve: 1}}
		},
	})
	m.Observe(inc(correlate.CauseInsertRace, correlate.RaceReplyClash, "shop", "a", 5002))
	m.Observe(inc(correlate.CauseInsertRace, correlate.RaceReplyClash, "shop", "b", 5004))
	m.Observe(inc(correlate.CauseClashResolved, correlate.RaceSameTuple, "shop", "c", 0))
	m.Observe(inc(correlate.CauseRuleDrop, "", "web", "d", 2500))
	s, err := metrics.Serve("127.0.0.1:0", m)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := Scrape(t, "http://"+s.Addr()+"/metrics")
	for k, want := range map[string]float64{
		`dnsrace_races_total{outcome="dropped",race="reply_clash"}`:                         2,
		`dnsrace_races_total{outcome="resolved",race="same_tuple"}`:                         1,
		`dnsrace_races_total{outcome="dropped",race="same_tuple"}`:                          0,
		`dnsrace_incidents_total{cause="insert_race"}`:                                      2,
		`dnsrace_incidents_total{cause="rule_drop"}`:                                        1,
		`dnsrace_incidents_total{cause="table_full"}`:                                       0,
		`dnsrace_stall_seconds_count`:                                                       3,
		`dnsrace_stall_seconds_bucket{le="5.1"}`:                                            3,
		`dnsrace_stall_seconds_bucket{le="4.9"}`:                                            1,
		`dnsrace_events_lost_total`:                                                         3,
		`dnsrace_bpf_recursion_misses_total{program="tp_kmem_cache_free"}`:                  2,
		`dnsrace_bpf_recursion_misses_total{program="tp_kfree_skb"}`:                        0,
		`dnsrace_probes{hook="nf_conntrack_confirm",tier="tracepoint"}`:                     1,
		`dnsrace_probes{hook="udp_sendmsg",tier="fentry"}`:                                  0,
		`dnsrace_conntrack_insert_failed_total{netns="4026532177"}`:                         28,
		`dnsrace_conntrack_clash_resolve_total{netns="4026532177"}`:                         1,
		`dnsrace_conntrack_early_drop_total{netns="4026532177"}`:                            0,
		`dnsrace_pod_incidents_total{cause="insert_race",namespace="shop",pod="a"}`:         1,
		`dnsrace_pod_incidents_total{cause="insert_race",namespace="shop",pod="b"}`:         1,
		`dnsrace_pod_incidents_total{cause="clash_resolved",namespace="other",pod="other"}`: 1,
		`dnsrace_pod_incidents_total{cause="rule_drop",namespace="other",pod="other"}`:      1,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", k, v, ok, want)
		}
	}
	for k := range got {
		if strings.Contains(k, `pod="c"`) || strings.Contains(k, `pod="d"`) {
			t.Errorf("pod label beyond the cap: %s", k)
		}
	}
}

// TestRaceSeriesFromZero: every race and outcome is exposed before the
// first incident, so increase() in Prometheus counts the first one.
func TestRaceSeriesFromZero(t *testing.T) {
	s, err := metrics.Serve("127.0.0.1:0", metrics.New(metrics.Config{}, metrics.Source{}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := Scrape(t, "http://"+s.Addr()+"/metrics")
	for _, race := range []string{correlate.RaceSameTuple, correlate.RaceReplyClash, "unknown"} {
		for _, outcome := range []string{"dropped", "resolved"} {
			k := `dnsrace_races_total{outcome="` + outcome + `",race="` + race + `"}`
			if v, ok := got[k]; !ok || v != 0 {
				t.Errorf("%s = %v (present %v), want 0 before any incident", k, v, ok)
			}
		}
	}
	if v, ok := got["dnsrace_stall_seconds_count"]; !ok || v != 0 {
		t.Errorf("dnsrace_stall_seconds_count = %v (present %v), want 0", v, ok)
	}
}

func TestNoPodLabels(t *testing.T) {
	m := metrics.New(metrics.Config{}, metrics.Source{})
	m.Observe(inc(correlate.CauseInsertRace, "", "shop", "a", 5000))
	s, err := metrics.Serve("127.0.0.1:0", m)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := Scrape(t, "http://"+s.Addr()+"/metrics")
	if got[`dnsrace_races_total{outcome="dropped",race="unknown"}`] != 1 {
		t.Errorf("race unknown not counted: %v", got)
	}
	for k := range got {
		if strings.Contains(k, "pod") {
			t.Errorf("pod label without PodLabels: %s", k)
		}
	}
}
