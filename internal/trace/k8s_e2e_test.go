package trace

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/lab"
	"github.com/dnsrace/dnsrace/internal/metrics"
	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/pcapout"
	"github.com/dnsrace/dnsrace/internal/podinfo"
	"github.com/dnsrace/dnsrace/internal/podinfo/podtest"
	"github.com/dnsrace/dnsrace/internal/probe"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// TestTraceKubernetes runs the snat-port scenario with what an operator
// attaches on a node: every lab pod's namespace holds a long-lived process
// (as the pause process on a real node) in a cgroup named as the kubelet's
// systemd driver names it, with the kubelet's log folders in a fixture
// root; the session names the pod of every incident, writes the packets to
// a pcapng file that tcpdump then reads, and serves Prometheus metrics that
// are scraped during and after the run.
func TestTraceKubernetes(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("tcpdump"); err != nil {
		testutil.SkipOrFail(t, "tcpdump is not installed (scripts/install-deps installs it)")
	}
	resolver := podinfo.New(podinfo.Config{})
	node, err := podtest.NewNode(resolver.CgroupRoot(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sc, err := lab.LookupScenario("snat-port")
	if err != nil {
		t.Fatal(err)
	}
	pcapPath := filepath.Join(t.TempDir(), "incidents.pcapng")
	pw, err := pcapout.Create(pcapPath)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu        sync.Mutex
		out       bytes.Buffer
		s         *Session
		sleepers  []*exec.Cmd
		podOfNS   = map[uint32]*podtest.Pod{}
		incidents []*correlate.Incident
		live      atomic.Pointer[Session]
		m         = metrics.New(metrics.Config{PodLabels: true}, MetricsSource(&live))
		srv       *metrics.Server
		scrapes   []map[string]float64
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer func() {
		for _, c := range sleepers {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
		if err := node.Close(); err != nil {
			t.Error(err)
		}
	}()
	scrapeURL := ""
	scrapeDone := make(chan struct{})
	rep, err := lab.Run(ctx, lab.RunConfig{
		Prefix: "dnsrace-tk",
		Drive:  lab.DriveConfig{Scenario: sc, UntilStall: lossyWindows * sc.Duration}, // as traceLossy
		OnUp: func(l *lab.Lab) error {
			for i := 0; i < l.Topology.Pods; i++ {
				c := nsutil.Command(ctx, l.Topology.PodNS(i), "sleep", "600")
				// No parent-death signal: it fires when the forking thread
				// exits, and the lab's namespace work ends locked threads.
				// The lab's teardown kills every process in its pods.
				c.SysProcAttr.Pdeathsig = 0
				if err := c.Start(); err != nil {
					return err
				}
				sleepers = append(sleepers, c)
				p, err := node.AddPod("lab", fmt.Sprintf("client-%d", i), "resolver", c.Process.Pid)
				if err != nil {
					return err
				}
				ino, err := nsutil.Inode(l.Topology.PodNS(i))
				if err != nil {
					return err
				}
				podOfNS[ino] = p
			}
			var err error
			s, err = Start(Options{
				Probe: probe.Options{Attach: tier(t)},
				Out:   &out,
				JSON:  true,
				Pods:  podinfo.New(podinfo.Config{Root: node.Root, CgroupRoot: node.CgroupRoot, TTL: time.Second}),
				OnIncident: func(inc *correlate.Incident) {
					m.Observe(inc)
					if err := pw.WriteIncident(inc); err != nil {
						t.Error(err)
					}
					mu.Lock()
					defer mu.Unlock()
					if _, ours := podOfNS[inc.NetNS]; ours {
						incidents = append(incidents, inc.Clone()) // inc is reused once this returns
					}
				},
			})
			if err != nil {
				return err
			}
			live.Store(s)
			if srv, err = metrics.Serve("127.0.0.1:0", m); err != nil {
				return err
			}
			scrapeURL = "http://" + srv.Addr() + "/metrics"
			go func() {
				defer close(scrapeDone)
				for ctx.Err() == nil {
					got := scrape(t, scrapeURL)
					mu.Lock()
					scrapes = append(scrapes, got)
					mu.Unlock()
					select {
					case <-ctx.Done():
					case <-time.After(2 * time.Second):
					}
				}
			}()
			return nil
		},
	})
	var sum *Summary
	if s != nil {
		sum = s.Stop()
	}
	cancel()
	if srv != nil {
		<-scrapeDone
		defer srv.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := pw.Close(); err != nil {
		t.Fatal(err)
	}

	// Tell a race that did not happen from one the tracer missed: the lab
	// must have made one (its clients stalled, the kernel refused inserts,
	// its expectation met) before the tracer's view is compared with it.
	if rep.Stalls == 0 {
		t.Fatalf("the lab produced no stall in %.0f s (%d queries sent, %d answers; kernel %+v): nothing to attribute",
			rep.DurationS, rep.QueriesSent, rep.AnswersReceived, rep.Conntrack)
	}
	if !rep.Expectation.Met {
		t.Fatalf("the lab's snat-port run did not show its expected outcome (%s): %s", rep.Expectation.Text, strings.Join(rep.Expectation.Failures, "; "))
	}
	// Pod attribution, in JSON too.
	if len(incidentsOf(incidents, correlate.CauseInsertRace)) == 0 {
		t.Fatalf("no insert_race incident in the lab's pods (%d of other causes), which stalled %d lookups (kernel %+v):\n%s",
			len(incidents), rep.Stalls, rep.Conntrack, out.String())
	}
	for _, inc := range incidents {
		p := podOfNS[inc.NetNS]
		if inc.Pod != p.Name || inc.Namespace != p.Namespace {
			t.Errorf("incident %d in netns %d: pod %q/%q, want %s/%s", inc.ID, inc.NetNS, inc.Namespace, inc.Pod, p.Namespace, p.Name)
		}
	}
	sc2 := bufio.NewScanner(&out)
	named := 0
	for sc2.Scan() {
		var obj map[string]any
		if json.Unmarshal(sc2.Bytes(), &obj) == nil && obj["type"] == "incident" && obj["namespace"] == "lab" &&
			strings.HasPrefix(fmt.Sprint(obj["pod"]), "client-") {
			named++
		}
	}
	if named != len(incidents) {
		t.Errorf("%d JSON incidents carry a lab pod, want %d", named, len(incidents))
	}

	// Metrics: the final scrape counts what the summary counts.
	final := scrape(t, scrapeURL)
	races := final[`dnsrace_races_total{outcome="dropped",race="reply_clash"}`] +
		final[`dnsrace_races_total{outcome="dropped",race="same_tuple"}`] +
		final[`dnsrace_races_total{outcome="dropped",race="unknown"}`]
	if int(races) != sum.Incidents[correlate.CauseInsertRace] || races == 0 {
		t.Errorf("metrics count %v dropped races, the summary %d insert_race incidents", races, sum.Incidents[correlate.CauseInsertRace])
	}
	if v := final[`dnsrace_incidents_total{cause="insert_race"}`]; int(v) != sum.Incidents[correlate.CauseInsertRace] {
		t.Errorf("dnsrace_incidents_total{insert_race} %v, summary %d", v, sum.Incidents[correlate.CauseInsertRace])
	}
	if v := final[`dnsrace_pod_incidents_total{cause="insert_race",namespace="lab",pod="client-0"}`] +
		final[`dnsrace_pod_incidents_total{cause="insert_race",namespace="lab",pod="client-1"}`] +
		final[`dnsrace_pod_incidents_total{cause="insert_race",namespace="lab",pod="client-2"}`] +
		final[`dnsrace_pod_incidents_total{cause="insert_race",namespace="lab",pod="client-3"}`]; int(v) != len(incidentsOf(incidents, correlate.CauseInsertRace)) {
		t.Errorf("pod-labelled insert_race %v, want %d", v, len(incidentsOf(incidents, correlate.CauseInsertRace)))
	}
	mu.Lock()
	during := len(scrapes)
	var mid map[string]float64
	if during > 0 {
		mid = scrapes[during-1]
	}
	mu.Unlock()
	if during < 2 {
		t.Errorf("only %d scrapes during the run", during)
	} else {
		key := fmt.Sprintf(`dnsrace_conntrack_insert_failed_total{netns="%d"}`, rep.NodeNetNS)
		if _, ok := mid[key]; !ok {
			t.Errorf("no live %s during the run", key)
		}
		// The drop tracepoint is attached at every tier.
		if mid[`dnsrace_probes{hook="kfree_skb",tier="tracepoint"}`] != 1 {
			t.Errorf("kfree_skb not reported attached: %v", mid)
		}
	}
	t.Logf("%d scrapes during the run; final: %v dropped races, summary %v", during, races, sum.Incidents)

	// pcap: every lost query of every lab incident is in the file.
	dump, err := exec.Command("tcpdump", "-nr", pcapPath).CombinedOutput()
	if err != nil {
		t.Fatalf("tcpdump -nr: %v\n%s", err, dump)
	}
	for _, inc := range incidents {
		if len(inc.Lost) == 0 {
			t.Errorf("incident %d (%s): no lost packet to find in the pcap", inc.ID, inc.Cause)
		}
		for i, l := range inc.Lost {
			if i > 0 {
				break // later lost packets carry the first one's tuple
			}
			want := fmt.Sprintf("%s > %s: %d+ %s? %s.", dotted(inc.Src), dotted(inc.Dst), l.ID, l.QType, inc.QName)
			if !strings.Contains(string(dump), want) {
				t.Errorf("incident %d: tcpdump lacks %q", inc.ID, want)
			}
		}
	}
	if _, err := exec.LookPath("tshark"); err == nil {
		cm, err := exec.Command("tshark", "-r", pcapPath, "-T", "fields", "-e", "frame.comment").CombinedOutput()
		if err != nil {
			t.Fatalf("tshark: %v\n%s", err, cm)
		}
		for _, inc := range incidents {
			want := fmt.Sprintf("dnsrace incident %d %s", inc.ID, inc.Cause)
			if !strings.Contains(string(cm), want) || !strings.Contains(string(cm), "pod lab/"+inc.Pod) {
				t.Errorf("tshark comments lack incident %d (%s, pod %s)", inc.ID, inc.Cause, inc.Pod)
			}
		}
	}
	t.Logf("pcap: %d packets for %d incidents in the lab's pods; first text line:\n%s", pw.Packets(), len(incidents), firstLine(dump))
}

func incidentsOf(incs []*correlate.Incident, cause string) []*correlate.Incident {
	var out []*correlate.Incident
	for _, i := range incs {
		if i.Cause == cause {
			out = append(out, i)
		}
	}
	return out
}

// dotted turns "10.0.0.1:53" into tcpdump's "10.0.0.1.53".
// dotted is an address and port as tcpdump prints them ("10.0.0.1.53").
func dotted(ap netip.AddrPort) string {
	return fmt.Sprintf("%s.%d", ap.Addr(), ap.Port())
}

func firstLine(b []byte) string {
	s := string(b)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func scrape(t *testing.T, url string) map[string]float64 {
	resp, err := http.Get(url)
	if err != nil {
		t.Errorf("scraping %s: %v", url, err)
		return nil
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
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}
