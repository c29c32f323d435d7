package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/lab"
	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// rulesFile is the rule file the end-to-end test loads, as shipped.
const rulesFile = "../../scripts/prometheus-rules.yaml"

// promConfig is the scrape of the test's tracer: every second, rules every
// second, and the labels the documented Kubernetes scrape gives
// (docs/prometheus.md): job dnsrace, a node label, and the tracer pod's own
// namespace and pod as target labels, which honor_labels must let
// dnsrace_pod_incidents_total override.
const promConfig = `global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %s
scrape_configs:
  - job_name: dnsrace
    honor_labels: true
    static_configs:
      - targets: ['%s']
        labels:
          node: lab-node
          namespace: kube-system
          pod: dnsrace-e2e
`

// promServer is a Prometheus server the test started.
type promServer struct {
	base   string
	cmd    *exec.Cmd
	stderr bytes.Buffer
}

// startPrometheus runs Debian's prometheus on a loopback port with its
// storage in a temporary directory; t's cleanup stops it and removes the
// directory, whatever the test's outcome.
func startPrometheus(t *testing.T, bin, target string) *promServer {
	t.Helper()
	dir := t.TempDir()
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, promConfig, rules, target), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &promServer{base: "http://" + freeAddr(t)}
	p.cmd = exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+strings.TrimPrefix(p.base, "http://"), "--log.level=warn")
	p.cmd.Stderr = &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting prometheus: %v", err)
	}
	// Registered after TempDir, so it runs before the directory goes.
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- p.cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
			t.Errorf("prometheus did not stop within 20s of SIGTERM")
		}
		if t.Failed() {
			t.Logf("prometheus stderr:\n%s", p.stderr.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(p.base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 60s: %v\n%s", err, p.stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// promSample is one series of an instant or range query.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
	Values [][2]any          `json:"values"`
}

// query runs a PromQL query at time at ("" for now) through the HTTP API.
func (p *promServer) query(t *testing.T, q, at string) []promSample {
	t.Helper()
	v := url.Values{"query": {q}}
	if at != "" {
		v.Set("time", at)
	}
	resp, err := http.Get(p.base + "/api/v1/query?" + v.Encode())
	if err != nil {
		t.Fatalf("querying %s: %v", q, err)
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []promSample `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || r.Status != "success" {
		t.Fatalf("querying %s: %v %s %s", q, err, r.Status, r.Error)
	}
	return r.Data.Result
}

// scalar is the value of a query that must return exactly one series.
func (p *promServer) scalar(t *testing.T, q, at string) float64 {
	t.Helper()
	res := p.query(t, q, at)
	if len(res) != 1 {
		t.Fatalf("%s at %s: %d series, want 1: %v", q, at, len(res), res)
	}
	v, err := strconv.ParseFloat(res[0].Value[1].(string), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

type promAlert struct {
	Labels   map[string]string `json:"labels"`
	State    string            `json:"state"`
	ActiveAt time.Time         `json:"activeAt"`
	Value    string            `json:"value"`
}

func (p *promServer) alerts(t *testing.T) []promAlert {
	t.Helper()
	resp, err := http.Get(p.base + "/api/v1/alerts")
	if err != nil {
		t.Fatalf("reading alerts: %v", err)
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("decoding alerts: %v", err)
	}
	return r.Data.Alerts
}

// waitFor polls cond every 200 ms until it holds or timeout passes.
func waitFor(timeout time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(timeout); ; time.Sleep(200 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// TestPrometheusEndToEnd scrapes the real tracer with a real Prometheus
// server that loads scripts/prometheus-rules.yaml, during the snat-port
// scenario (4 pods, glibc getent loops for 20 s): the stall alert must
// fire, the dropped races Prometheus stored must be exactly the tracer's
// summary count, the stalls exactly the incidents with a stall, and the
// per-pod series must carry the traced pod's labels, not the scrape's.
func TestPrometheusEndToEnd(t *testing.T) {
	testutil.RequireRoot(t)
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		testutil.SkipOrFail(t, "prometheus is not installed (Debian package prometheus; scripts/install-deps)")
	}
	const prefix = "dnsrace-e8"
	defer assertClean(t, prefix)
	t0 := time.Now()
	if r := runBin(t, 60*time.Second, "lab", "up", "--scenario", "snat-port", "--prefix", prefix); r.code != 0 {
		t.Fatalf("lab up: %s", r.stderr)
	}
	defer runBin(t, 60*time.Second, "lab", "down", "--prefix", prefix)

	// pod0 looks like a kubelet pod: a long-lived process in its netns,
	// in a kubelet-named cgroup, with its log folder under root.
	root := kubeletPod(t, prefix+"-pod0")

	metricsAddr := freeAddr(t)
	ready := filepath.Join(t.TempDir(), "ready")
	var out, errb bytes.Buffer
	tr := exec.Command(dnsraceBin, "trace", "--json", "--metrics-addr", metricsAddr, "--metrics-pod-labels",
		"--root", root, "--progress", "never", "--ready-file", ready)
	tr.Stdout, tr.Stderr = &out, &errb
	tr.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	traceDone := false
	defer func() {
		if !traceDone {
			_ = tr.Process.Kill()
			_ = tr.Wait()
		}
	}()
	waitReady(t, tr, ready, &errb)

	prom := startPrometheus(t, promBin, metricsAddr)
	if !waitFor(30*time.Second, func() bool {
		r := prom.query(t, `up{job="dnsrace"} == 1`, "")
		return len(r) == 1
	}) {
		t.Fatalf("the tracer's target never came up in prometheus; prometheus: %s; tracer: %s", prom.stderr.String(), errb.String())
	}
	setup := time.Since(t0)

	// glibc lookups in every pod for 20 s, each let finish (a stalled one
	// takes 5 s or more), as the lab's own snat-port client does; past
	// that, up to 150 s, until what the checks below need has happened:
	// the 3 stalls the alert fires at, one of them in pod0. The race
	// needs two pods' queries at one instant, so the lookups run back to
	// back from a shell in each pod: started one by one through the
	// helper (tens of milliseconds of Go start-up each, both CPUs busy
	// with it) they come too far apart to race.
	t1 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	var (
		wg                     sync.WaitGroup
		mu                     sync.Mutex
		lookups, stalled, pod0 int
		stop                   = time.Now().Add(20 * time.Second)
		limit                  = time.Now().Add(150 * time.Second)
		firstStall, fired      time.Time
	)
	driving := func() bool {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		return ctx.Err() == nil && (now.Before(stop) || (stalled < 3 || pod0 == 0) && now.Before(limit))
	}
	// Each line: a lookup's start and end (ns). The shell ends after the
	// lookup it is in once the stop file exists.
	stopFile := filepath.Join(t.TempDir(), "stop")
	const loop = `while [ ! -e "$2" ]; do s=$(date +%s%N); getent ahosts "$1" >/dev/null; echo "$s $(date +%s%N)"; done`
	for i := range 4 {
		c := exec.CommandContext(ctx, dnsraceBin, nsutil.ExecHelperArg, fmt.Sprintf("%s-pod%d", prefix, i), "--", "sh", "-c", loop, "sh", lab.QName(i), stopFile)
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
		lines, err := c.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Wait()
			sc := bufio.NewScanner(lines)
			for sc.Scan() {
				var s, e int64
				if _, err := fmt.Sscan(sc.Text(), &s, &e); err != nil {
					t.Errorf("pod%d: lookup line %q: %v", i, sc.Text(), err)
					return
				}
				mu.Lock()
				lookups++
				if time.Duration(e-s) >= 4900*time.Millisecond {
					stalled++
					if i == 0 {
						pod0++
					}
					if firstStall.IsZero() || time.Unix(0, s).Before(firstStall) {
						firstStall = time.Unix(0, s)
					}
				}
				mu.Unlock()
			}
		}()
	}
	go func() {
		for driving() {
			time.Sleep(100 * time.Millisecond)
		}
		_ = os.WriteFile(stopFile, nil, 0o644)
	}()
	// Watch for the stall alert while the lookups run.
	alertOf := func() *promAlert {
		for _, a := range prom.alerts(t) {
			if a.Labels["alertname"] == "DnsraceLookupsStalling" {
				return &a
			}
		}
		return nil
	}
	var firing *promAlert
	watch := make(chan struct{})
	go func() {
		defer close(watch)
		for ctx.Err() == nil {
			if a := alertOf(); a != nil && a.State == "firing" {
				mu.Lock()
				firing, fired = a, time.Now()
				mu.Unlock()
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	wg.Wait()
	driven := time.Since(t1)
	// The tracer closes an incident once the retry is seen; give the last
	// ones a moment, then wait for the alert (if it has not fired yet).
	select {
	case <-watch:
	case <-time.After(30 * time.Second):
		cancel()
		<-watch
	}
	// Settle: no lookup in flight; scrapes for 3 s after the last
	// incident, so a pod's counter that first appeared with it has the
	// two samples rate() in the recording rules needs (else a pod whose
	// only stall comes last has no namespace_pod series).
	time.Sleep(time.Second)
	settled := time.Now()
	if !waitFor(15*time.Second, func() bool {
		return prom.scalar(t, `timestamp(up{job="dnsrace"})`, "") > float64(settled.UnixMilli())/1e3+3
	}) {
		t.Fatal("no scrape after the lookups ended")
	}
	_ = tr.Process.Signal(syscall.SIGTERM)
	err = tr.Wait()
	traceDone = true
	if err != nil {
		t.Fatalf("trace exited with %v: %s", err, errb.String())
	}
	stoppedAt := time.Now()

	// The tracer's own account: the summary, and the incidents.
	var summary struct {
		Incidents map[string]int `json:"incidents"`
	}
	haveSummary := false
	stalls, podStalls := 0, 0
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var obj struct {
			Type      string   `json:"type"`
			Cause     string   `json:"cause"`
			StallMs   *float64 `json:"stall_ms"`
			Namespace string   `json:"namespace"`
			Pod       string   `json:"pod"`
		}
		if err := json.Unmarshal(sc.Bytes(), &obj); err != nil {
			t.Fatalf("not JSON Lines: %q", sc.Text())
		}
		switch obj.Type {
		case "summary":
			if err := json.Unmarshal(sc.Bytes(), &summary); err != nil {
				t.Fatal(err)
			}
			haveSummary = true
		case "incident":
			if obj.StallMs != nil && obj.Cause != "clash_resolved" {
				stalls++
			}
			if obj.Namespace == "shop" && obj.Pod == "checkout-7f9c" && obj.Cause != "clash_resolved" {
				podStalls++
			}
		}
	}
	if !haveSummary {
		t.Fatalf("no summary; stderr %s", errb.String())
	}
	dropped := summary.Incidents["insert_race"]
	t.Logf("%d lookups, %d took >= 4.9 s; summary: %d insert_race (dropped races), %d incidents with a stall, %d in shop/checkout-7f9c",
		lookups, stalled, dropped, stalls, podStalls)
	if dropped == 0 || stalled == 0 {
		t.Fatalf("the scenario made no race (%d dropped, %d stalled lookups): nothing to check", dropped, stalled)
	}

	if firing == nil {
		var state string
		if a := alertOf(); a != nil {
			state = a.State
		}
		t.Errorf("DnsraceLookupsStalling never fired (state %q) though %d lookups stalled", state, stalled)
	} else {
		t.Logf("DnsraceLookupsStalling firing %.1fs after the first stalled lookup began (value %s, labels %v)",
			fired.Sub(firstStall).Seconds(), firing.Value, firing.Labels)
		if firing.Labels["node"] != "lab-node" || firing.Labels["instance"] != metricsAddr || firing.Labels["job"] != "dnsrace" {
			t.Errorf("alert labels %v: want job dnsrace, instance %s, node lab-node", firing.Labels, metricsAddr)
		}
	}

	// The last scrape's time: increase() evaluated there over a window
	// that starts before the first scrape is exact. The series start at 0
	// (every race is exposed from 0), which stops the extrapolation at the
	// start, and the window ends on a sample, so none at the end either.
	last := prom.query(t, `dnsrace_races_total{job="dnsrace",outcome="dropped"}[10m]`, "")
	if len(last) == 0 {
		t.Fatal("no dnsrace_races_total series in prometheus")
	}
	var lastT float64
	for _, s := range last {
		ts := s.Values[len(s.Values)-1][0].(float64)
		lastT = max(lastT, ts)
	}
	at := strconv.FormatFloat(lastT, 'f', 3, 64)
	window := fmt.Sprintf("%ds", int(stoppedAt.Sub(t0).Seconds())+60)
	inc := prom.scalar(t, `sum(increase(dnsrace_races_total{job="dnsrace",outcome="dropped"}[`+window+`]))`, at)
	maxv := prom.scalar(t, `sum(max_over_time(dnsrace_races_total{job="dnsrace",outcome="dropped"}[`+window+`]))`, at)
	t.Logf("prometheus at the last scrape: increase() %v, max_over_time %v; summary %d", inc, maxv, dropped)
	if inc != float64(dropped) || maxv != float64(dropped) {
		t.Errorf("dropped races: increase() %v, max_over_time %v in prometheus, %d in the summary", inc, maxv, dropped)
	}
	if got := prom.scalar(t, `sum(max_over_time(dnsrace_stall_seconds_count{job="dnsrace"}[`+window+`]))`, at); got != float64(stalls) {
		t.Errorf("dnsrace_stall_seconds_count %v in prometheus, %d incidents with a stall", got, stalls)
	}

	// Recording rules: per node, and per pod with the traced pod's labels.
	if r := prom.query(t, `max_over_time(node:dnsrace_stalls:rate5m{job="dnsrace",node="lab-node",instance="`+metricsAddr+`"}[`+window+`]) > 0`, at); len(r) != 1 {
		t.Errorf("node:dnsrace_stalls:rate5m: %v", r)
	}
	if r := prom.query(t, `max_over_time(node:dnsrace_races:rate5m{outcome="dropped"}[`+window+`]) > 0`, at); len(r) != 1 {
		t.Errorf("node:dnsrace_races:rate5m{outcome=dropped}: %v", r)
	}
	if podStalls > 0 {
		got := prom.scalar(t, `sum(max_over_time(dnsrace_pod_incidents_total{namespace="shop",pod="checkout-7f9c",cause!="clash_resolved"}[`+window+`]))`, at)
		if got != float64(podStalls) {
			t.Errorf("dnsrace_pod_incidents_total of shop/checkout-7f9c: %v in prometheus, %d incidents", got, podStalls)
		}
		if r := prom.query(t, `namespace_pod:dnsrace_stalls:rate5m{namespace="shop",pod="checkout-7f9c",node="lab-node"}[`+window+`]`, at); len(r) != 1 {
			t.Errorf("namespace_pod:dnsrace_stalls:rate5m of shop/checkout-7f9c: %v", r)
		}
	} else {
		t.Errorf("no incident named pod shop/checkout-7f9c")
	}
	if r := prom.query(t, `{__name__=~"dnsrace_.*", exported_pod!=""}[`+window+`]`, at); len(r) != 0 {
		t.Errorf("series with exported_pod: honor_labels did not keep the tracer's labels: %v", r[0].Metric)
	}
	// The tracer is gone: its target goes down (what DnsraceTracerDown
	// waits 5 minutes on).
	if !waitFor(10*time.Second, func() bool { return len(prom.query(t, `up{job="dnsrace"} == 0`, "")) == 1 }) {
		t.Errorf("up{job=dnsrace} did not drop to 0 after the tracer stopped")
	}
	t.Logf("timings: setup %.1fs, lookups %.1fs, total %.1fs", setup.Seconds(), driven.Seconds(), time.Since(t0).Seconds())
}
