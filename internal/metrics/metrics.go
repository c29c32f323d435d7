package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/ctstats"
)

// Probe is one hook's state.
type Probe struct {
	Hook, Tier string
	Attached   bool
}

// Source gives live values at scrape time. Any func may be nil.
type Source struct {
	EventsLost func() uint64
	// Missed: by BPF program, runs the kernel skipped (recursion misses).
	Missed    func() map[string]uint64
	Probes    func() []Probe
	Conntrack func() map[uint32]ctstats.Counters
	// Untracked: queries the kernel's full flow table could not follow.
	Untracked func() uint64
}

// Config of the metrics.
type Config struct {
	// PodLabels adds dnsrace_pod_incidents_total{namespace,pod,cause}.
	PodLabels bool
	// MaxPods caps the distinct pods labelled (default 200).
	MaxPods int
}

// Metrics holds the collectors of one session.
type Metrics struct {
	cfg       Config
	reg       *prometheus.Registry
	races     *prometheus.CounterVec
	incidents *prometheus.CounterVec
	refused   *prometheus.CounterVec
	stall     prometheus.Histogram
	pods      *prometheus.CounterVec

	mu      sync.Mutex
	podSeen map[[2]string]bool
}

// StallBuckets are the stall histogram's upper bounds in seconds, dense
// around the resolvers' timeouts (musl 2.5 s, glibc 5 s, two glibc 10 s).
var StallBuckets = []float64{0.5, 1, 2, 2.4, 2.6, 4.9, 5.1, 6, 9.9, 10.1, 15, 30}

// New registers every collector; src is read at scrape time.
func New(cfg Config, src Source) *Metrics {
	if cfg.MaxPods <= 0 {
		cfg.MaxPods = 200
	}
	m := &Metrics{cfg: cfg, reg: prometheus.NewRegistry(), podSeen: map[[2]string]bool{}}
	m.races = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dnsrace_races_total",
		Help: "Conntrack insertion races: outcome dropped (a query lost, an insert_race incident), resolved (rescued by the kernel, clash_resolved) or refused_at_send (lost inside its send, resent at once, no lookup waited)."},
		[]string{"race", "outcome"})
	m.incidents = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dnsrace_incidents_total",
		Help: "Incidents (stalls, or races the kernel rescued) by cause."}, []string{"cause"})
	m.stall = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dnsrace_stall_seconds",
		Help: "Time from a lost DNS query to the resolver's retry.", Buckets: StallBuckets})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dnsrace_sends_refused_total",
		Help: "Queries dropped inside their send (the sender was told) and resent at once: no lookup waited, by cause."}, []string{"cause"})
	m.reg.MustRegister(m.races, m.incidents, m.stall, m.refused)
	for _, c := range correlate.Causes {
		m.incidents.WithLabelValues(c)
		m.refused.WithLabelValues(c)
	}
	// Every race series exists from 0, "unknown" too: Prometheus's
	// increase() and rate() see a series' first sample as its start, so a
	// counter born at 1 would hide its first race.
	for _, r := range []string{correlate.RaceSameTuple, correlate.RaceReplyClash, "unknown"} {
		m.races.WithLabelValues(r, "dropped")
		m.races.WithLabelValues(r, "resolved")
		m.races.WithLabelValues(r, "refused_at_send")
	}
	if cfg.PodLabels {
		m.pods = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dnsrace_pod_incidents_total",
			Help: fmt.Sprintf("Incidents by pod and cause (at most %d pods, the others as pod=\"other\"; host processes as pod=\"host\").", cfg.MaxPods)},
			[]string{"namespace", "pod", "cause"})
		m.reg.MustRegister(m.pods)
	}
	m.reg.MustRegister(&live{src: src})
	return m
}

// Registry is where the collectors are registered.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Observe counts one incident.
func (m *Metrics) Observe(inc *correlate.Incident) {
	race := "unknown"
	if inc.Race != nil {
		race = *inc.Race
	}
	if inc.RefusedAtSend {
		// No lookup waited: not an incident of the stall counters.
		m.refused.WithLabelValues(inc.Cause).Inc()
		if inc.Cause == correlate.CauseInsertRace {
			m.races.WithLabelValues(race, "refused_at_send").Inc()
		}
		return
	}
	m.incidents.WithLabelValues(inc.Cause).Inc()
	switch inc.Cause {
	case correlate.CauseInsertRace:
		m.races.WithLabelValues(race, "dropped").Inc()
	case correlate.CauseClashResolved:
		m.races.WithLabelValues(race, "resolved").Inc()
	}
	if inc.StallMs != nil && inc.Cause != correlate.CauseClashResolved {
		m.stall.Observe(*inc.StallMs / 1e3)
	}
	if m.pods != nil && inc.Pod != "" {
		key := [2]string{inc.Namespace, inc.Pod}
		m.mu.Lock()
		if !m.podSeen[key] {
			if len(m.podSeen) < m.cfg.MaxPods {
				m.podSeen[key] = true
			} else {
				key = [2]string{"other", "other"}
			}
		}
		m.mu.Unlock()
		m.pods.WithLabelValues(key[0], key[1], inc.Cause).Inc()
	}
}

// live collects the values read at scrape time.
type live struct{ src Source }

var (
	descLost      = prometheus.NewDesc("dnsrace_events_lost_total", "Ring buffer records the kernel could not deliver (counted per CPU in the kernel).", nil, nil)
	descMissed    = prometheus.NewDesc("dnsrace_bpf_recursion_misses_total", "Hook calls the kernel did not run the BPF program for because a BPF program was already running on that CPU.", []string{"program"}, nil)
	descProbes    = prometheus.NewDesc("dnsrace_probes", "1 when the hook is attached at that tier, else 0.", []string{"hook", "tier"}, nil)
	descUntracked = prometheus.NewDesc("dnsrace_queries_untracked_total",
		"Queries the kernel's flow table had no room for, or evicted young to make room: their answers cannot be matched (never counted as losses); raise --flow-entries.", nil, nil)
	descCT  = map[string]*prometheus.Desc{}
	ctNames = []string{"insert_failed", "drop", "early_drop", "clash_resolve"}
)

func init() {
	for _, n := range ctNames {
		descCT[n] = prometheus.NewDesc("dnsrace_conntrack_"+n+"_total",
			"The kernel's per-CPU conntrack "+n+" counter, summed, since dnsrace's baseline of the namespace.", []string{"netns"}, nil)
	}
}

func (l *live) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLost
	ch <- descMissed
	ch <- descProbes
	ch <- descUntracked
	for _, n := range ctNames {
		ch <- descCT[n]
	}
}

func (l *live) Collect(ch chan<- prometheus.Metric) {
	if l.src.EventsLost != nil {
		ch <- prometheus.MustNewConstMetric(descLost, prometheus.CounterValue, float64(l.src.EventsLost()))
	}
	if l.src.Missed != nil {
		for prog, n := range l.src.Missed() {
			ch <- prometheus.MustNewConstMetric(descMissed, prometheus.CounterValue, float64(n), prog)
		}
	}
	if l.src.Untracked != nil {
		ch <- prometheus.MustNewConstMetric(descUntracked, prometheus.CounterValue, float64(l.src.Untracked()))
	}
	if l.src.Probes != nil {
		for _, p := range l.src.Probes() {
			v := 0.0
			if p.Attached {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descProbes, prometheus.GaugeValue, v, p.Hook, p.Tier)
		}
	}
	if l.src.Conntrack != nil {
		for ns, c := range l.src.Conntrack() {
			label := strconv.FormatUint(uint64(ns), 10)
			for n, v := range map[string]uint64{"insert_failed": c.InsertFailed, "drop": c.Drop, "early_drop": c.EarlyDrop, "clash_resolve": c.ClashResolve} {
				ch <- prometheus.MustNewConstMetric(descCT[n], prometheus.CounterValue, float64(v), label)
			}
		}
	}
}

// Server serves /metrics.
type Server struct {
	ln  net.Listener
	srv *http.Server
	err chan error
}

// Serve listens on addr (":9153", "127.0.0.1:0") and serves m.
func Serve(addr string, m *Metrics) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for metrics on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "dnsrace: metrics at /metrics")
	})
	s := &Server{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, err: make(chan error, 1)}
	go func() { s.err <- s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the address it listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops serving.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("stopping the metrics server: %w", err)
	}
	if err := <-s.err; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving metrics: %w", err)
	}
	return nil
}
