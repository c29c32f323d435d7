package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/lab"
	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/overhead"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// answerWithin is how long a live query of the tracer (a checkpoint, a
// scrape, a progress redraw) may take before the test calls it hung. It is
// a liveness bound, not a speed target: a healthy tracer answers in
// milliseconds, a deadlocked one never.
const answerWithin = time.Second

// TestTraceLiveUnderLoad: while real DNS traffic keeps the reader busy
// (glibc lookups in 4 pods whose AAAA queries the node's firewall drops, so
// that every lookup stalls and incidents are written throughout, plus a
// paced query flood), SIGUSR1 three times, /metrics scraped in a loop by 20
// clients and the progress line must all keep answering, and SIGTERM must
// still end with the summary. The reader never shares a lock with any of
// them. The stalls come from the rule-drop lab, not a race: lookups started
// one by one through the helper seldom race (TestPrometheusEndToEnd), and
// with no incident the checkpoints' counts below would compare zeros.
func TestTraceLiveUnderLoad(t *testing.T) {
	testutil.RequireRoot(t)
	prefix := fmt.Sprintf("dnsrace-lv%d", time.Now().UnixNano()%10000)
	defer assertClean(t, prefix)
	if r := runBin(t, 60*time.Second, "lab", "up", "--scenario", "rule-drop", "--pods", "4", "--prefix", prefix); r.code != 0 {
		t.Fatalf("lab up: %s", r.stderr)
	}
	defer runBin(t, 60*time.Second, "lab", "down", "--prefix", prefix)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ready := filepath.Join(t.TempDir(), "ready")
	tr := exec.Command(dnsraceBin, "trace", "--json", "--progress", "always", "--metrics-addr", addr, "--ready-file", ready)
	stdout, err := tr.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb syncBuffer
	tr.Stderr = &errb
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	defer tr.Process.Kill()
	waitReady(t, tr, ready, &errb)

	// Every JSON line, with the time it arrived.
	type line struct {
		at  time.Time
		obj map[string]any
	}
	lines := make(chan line, 1<<16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var obj map[string]any
			if err := json.Unmarshal(sc.Bytes(), &obj); err != nil {
				t.Errorf("not a JSON line: %q", sc.Text())
				continue
			}
			lines <- line{time.Now(), obj}
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 14*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	// Load: glibc lookups in every pod (each stalls on its dropped AAAA)
	// and a paced flood of answered A queries from pod 0.
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				look := exec.CommandContext(ctx, dnsraceBin, nsutil.ExecHelperArg, fmt.Sprintf("%s-pod%d", prefix, i), "--", "getent", "ahosts", lab.QName(i))
				_ = look.Run()
			}
		}()
	}
	var flood overhead.FloodResult
	wg.Add(1)
	go func() {
		defer wg.Done()
		flood, _ = overhead.Flood(ctx, overhead.FloodConfig{NS: prefix + "-pod0", Dst: netip.AddrPortFrom(lab.VIP, 53),
			DNS: true, ReadAnswers: true, Rate: 20000, Duration: 12 * time.Second})
	}()
	// 20 scrapers, each request bounded by answerWithin.
	var scrapes, slow atomic.Int64
	client := &http.Client{Timeout: answerWithin}
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				resp, err := client.Get("http://" + addr + "/metrics")
				if err != nil {
					slow.Add(1)
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !bytes.Contains(body, []byte("dnsrace_events_lost_total")) {
					t.Errorf("scrape: status %d", resp.StatusCode)
				}
				scrapes.Add(1)
			}
		}()
	}

	// Every checkpoint must count exactly the incidents written before it
	// (it is written between two ticks' output, never inside an incident);
	// tally counts the incidents and checks each checkpoint.
	incidents, checkpoints, afterIncidents := 0, 0, 0
	tally := func(l line) {
		switch l.obj["type"] {
		case "incident":
			incidents++
		case "checkpoint":
			checkpoints++
			if n := countIncidents(l.obj); n != incidents {
				t.Errorf("checkpoint %d counts %d incidents, %d were written before it", checkpoints, n, incidents)
			}
			if incidents > 0 {
				afterIncidents++
			}
		}
	}
	// Three checkpoints, each must arrive within answerWithin.
	time.Sleep(3 * time.Second)
	for i := range 3 {
		sent := time.Now()
		if err := tr.Process.Signal(syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		got := false
		for !got {
			select {
			case l := <-lines:
				tally(l)
				if l.obj["type"] == "checkpoint" {
					got = true
					if d := l.at.Sub(sent); d > answerWithin {
						t.Errorf("checkpoint %d came %v after SIGUSR1", i, d)
					}
				}
			case <-time.After(answerWithin):
				t.Fatalf("checkpoint %d: nothing within %v of SIGUSR1; stderr:\n%s", i, answerWithin, errb.String())
			}
		}
		time.Sleep(2 * time.Second)
	}
	// The progress line is redrawn every second while all this goes on,
	// and a burst of checkpoints lands among the incidents (each is
	// checked below, as the three above).
	before := strings.Count(errb.String(), "tracing ")
	for range 50 {
		if err := tr.Process.Signal(syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if after := strings.Count(errb.String(), "tracing "); after < before+2 {
		t.Errorf("progress line redrawn %d times in 2.5 s, want >= 2", after-before)
	}
	wg.Wait()

	stopped := time.Now()
	if err := tr.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var summary map[string]any
	timed := checkpoints
	for l := range lines {
		tally(l)
		if l.obj["type"] == "summary" {
			summary = l.obj
		}
	}
	burst := checkpoints - timed
	if err := tr.Wait(); err != nil {
		t.Fatalf("trace exited with %v: %s", err, errb.String())
	}
	if summary == nil {
		t.Fatalf("no summary after SIGTERM; stderr:\n%s", errb.String())
	}
	t.Logf("flood %+v; %d incidents; %d checkpoints for a burst of 50 SIGUSR1; %d scrapes (%d failed or slower than %v); summary %v after SIGTERM; events %v lost %v",
		flood, incidents, burst, scrapes.Load(), slow.Load(), answerWithin, time.Since(stopped).Round(time.Millisecond), summary["events"], summary["events_lost"])
	if burst == 0 {
		t.Error("no checkpoint for a burst of 50 SIGUSR1")
	}
	// The checkpoints' counts were checked against something: incidents
	// were written before some of them.
	if incidents == 0 || afterIncidents == 0 {
		t.Errorf("%d incidents written, %d of %d checkpoints after one: the counts compared zeros", incidents, afterIncidents, checkpoints)
	}
	if n := countIncidents(summary); n != incidents {
		t.Errorf("the summary counts %d incidents, %d were written", n, incidents)
	}
	if slow.Load() > 0 {
		t.Errorf("%d of %d scrapes failed or took longer than %v", slow.Load(), scrapes.Load()+slow.Load(), answerWithin)
	}
	if flood.Answers == 0 {
		t.Error("the flood got no answers: no load on the tracer")
	}
	// Nothing lost that the kernel did not count: every record the reader
	// got decoded, and a ring-buffer loss is named as a mismatch.
	if m := summary["events_malformed"].(float64); m != 0 {
		t.Errorf("%v malformed records", m)
	}
	if lost := summary["events_lost"].(float64); lost > 0 {
		if !strings.Contains(fmt.Sprint(summary["mismatch"]), "events lost") {
			t.Errorf("%v events lost but the summary's mismatch does not say so: %v", lost, summary["mismatch"])
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the process's writes and the
// test's reads at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// countIncidents sums a checkpoint's or summary's incidents by cause.
func countIncidents(sum map[string]any) int {
	n := 0
	for _, v := range sum["incidents"].(map[string]any) {
		n += int(v.(float64))
	}
	return n
}
