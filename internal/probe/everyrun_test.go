package probe

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/kconfig"
	"github.com/dnsrace/dnsrace/internal/preemption"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// TestEveryCallTraced: queries from more threads than CPUs, each on a
// socket of its own, in a namespace that tracks connections (so every
// query's first packet is confirmed in its sender's own task, at
// POSTROUTING), must each leave a QUERY and an ANSWER record, and the
// confirm hook must run at least once per query (each a new entry). Sends, reads and local confirms
// run in a task, where a kernel that preempts kernel code (full, lazy, RT)
// can preempt a fentry program: the trampoline's per-program recursion
// guard then skips that program for every other task on the CPU until it
// resumes, and each skipped run is a query never seen or an answer never
// matched (docs/kernel.md §12). Nothing here runs a hook in a softirq
// nested inside another (no conntrack in the server namespace, no drops),
// so no run may be skipped in any tier.
func TestEveryCallTraced(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	const (
		workers   = 16
		perWorker = 128
		asked     = workers * perWorker
	)
	version, _ := os.ReadFile(preemption.VersionFile)
	models, _ := os.ReadFile(preemption.DebugfsFile)
	t.Logf("kernel %s, %s %q: preemption %s", strings.TrimSpace(string(version)), preemption.DebugfsFile, models,
		preemption.Detect(os.Open, kconfig.Release()))
	n := newTwoNS(t)
	n.serveDNS(t, serverAddr, 0, 1)
	// A rule that reads the entry's state makes the client namespace track
	// connections (nft_ct takes conntrack for it).
	nftRules(t, n.client, nftables.TableFamilyIPv4, nftables.ChainTypeFilter,
		nftables.ChainHookOutput, nftables.ChainPriorityFilter, ctStateNew()...)

	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatalf("enabling BPF run-time statistics: %v", err)
	}
	defer stats.Close()
	tr := openTier(t, Options{Attach: testTier(t)})
	c := collect(t, tr)
	before := programRuns(t, tr)

	var answered atomic.Int64
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- n.askOwnSockets(20000, w, perWorker, &answered)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := answered.Load(); got != asked {
		t.Fatalf("%d of %d queries answered by the test server", got, asked)
	}

	// By source port, one socket each: a query must have a QUERY record
	// and one of its records' ids an ANSWER. (A query whose packet took
	// longer than RESEND_GAP_MS from its send to its confirm, a task
	// descheduled between them, is seen again as a resend: a second QUERY
	// record, and the answer names that one.)
	var seen, matched map[uint16]bool
	resent := 0
	tally := func() {
		seen, matched, resent = map[uint16]bool{}, map[uint16]bool{}, 0
		port := map[uint64]uint16{}
		all := c.all()
		for _, e := range all {
			if e.Kind == event.KindQuery && e.NetNS == n.clientIno {
				p := e.Packet.Src.Port()
				if seen[p] {
					resent++
				}
				seen[p], port[e.QID] = true, p
			}
		}
		for _, e := range all {
			if p, ok := port[e.QID]; ok && e.Kind == event.KindAnswer && e.NetNS == n.clientIno {
				matched[p] = true
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for tally(); (len(seen) < asked || len(matched) < asked) && time.Now().Before(deadline); tally() {
		time.Sleep(2 * IdleEvery)
	}
	missed, err := tr.Missed()
	if err != nil {
		t.Fatalf("Missed: %v", err)
	}
	for name, k := range missed {
		if k > 0 {
			t.Logf("%s skipped %d runs", name, k)
		}
	}
	if resent > 0 {
		t.Logf("%d queries seen again as a resend", resent)
	}
	if len(seen) != asked || len(matched) != asked {
		t.Errorf("of %d answered queries, %d have a QUERY record and %d an ANSWER record (%d records lost): hook runs were skipped",
			asked, len(seen), len(matched), tr.Lost())
	}
	if tr.Mode() != ModeFunction {
		return
	}
	after := programRuns(t, tr)
	p := probeByHook(tr, "nf_conntrack_confirm")
	for _, name := range splitPrograms(p.Program) {
		if runs := after[name] - before[name]; runs < asked {
			t.Errorf("%s (%s) ran %d times for %d new entries confirmed in their senders' tasks", name, p.Tier, runs, asked)
		}
	}
}

// askOwnSockets sends k queries from the client namespace, each from a new
// socket on a port of its own from firstPort on (a new conntrack entry), on
// this goroutine's own thread with
// blocking calls, so the kernel has as many tasks to schedule as there are
// workers; every answer read counts in answered.
func (n *twoNS) askOwnSockets(firstPort, worker, k int, answered *atomic.Int64) error {
	return inNS(n.client, func() error {
		query := make([]byte, 0, 64)
		buf := make([]byte, 512)
		dst := &unix.SockaddrInet4{Port: 53, Addr: [4]byte{10, 199, 0, 2}}
		for i := range k {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("worker %d: socket: %w", worker, err)
			}
			tv := unix.Timeval{Sec: 5}
			err = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
			if err == nil {
				// A port of its own: an ephemeral one may be a closed
				// socket's, whose entry is still in the table.
				err = unix.Bind(fd, &unix.SockaddrInet4{Port: firstPort + worker*k + i})
			}
			if err == nil {
				err = unix.Connect(fd, dst)
			}
			if err == nil {
				query = appendQuery(query[:0], uint16(worker<<8|i&0xff))
				err = noEINTR(func() error { _, err := unix.Write(fd, query); return err })
			}
			if err == nil {
				err = noEINTR(func() error { _, err := unix.Read(fd, buf); return err })
			}
			unix.Close(fd)
			if err != nil {
				return fmt.Errorf("worker %d, query %d: %w", worker, i, err)
			}
			answered.Add(1)
		}
		return nil
	})
}

// noEINTR calls fn again while a signal interrupts it (the Go runtime
// signals its threads to preempt goroutines).
func noEINTR(fn func() error) error {
	for {
		if err := fn(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// appendQuery appends a DNS query for "every.dnsrace.test." A with id.
func appendQuery(b []byte, id uint16) []byte {
	b = append(b, byte(id>>8), byte(id), 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0)
	for _, label := range []string{"every", "dnsrace", "test"} {
		b = append(b, byte(len(label)))
		b = append(b, label...)
	}
	return append(b, 0, 0, 1, 0, 1)
}

// programRuns is each attached program's run count (with BPF statistics
// on), by name.
func programRuns(t *testing.T, tr *Tracer) map[string]uint64 {
	t.Helper()
	runs := map[string]uint64{}
	for _, c := range tr.colls {
		for name, p := range c.Programs {
			st, err := p.Stats()
			if err != nil {
				t.Fatalf("reading the statistics of %s: %v", name, err)
			}
			runs[name] = st.RunCount
		}
	}
	return runs
}

// splitPrograms is ProbeInfo.Program's program names.
func splitPrograms(s string) []string {
	return strings.Split(strings.TrimSuffix(s, " (kprobe.multi)"), "+")
}
