package overhead

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"

	"github.com/dnsrace/dnsrace/internal/kconfig"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// dnsraceBinary is DNSRACE_BIN (the VM harness's /usr/bin/dnsrace), or
// ./cmd/dnsrace built into t's temporary directory.
func dnsraceBinary(t *testing.T) string {
	t.Helper()
	if exe := os.Getenv("DNSRACE_BIN"); exe != "" {
		return exe
	}
	exe := filepath.Join(t.TempDir(), "dnsrace")
	cmd := exec.Command("go", "build", "-o", exe, "../../cmd/dnsrace")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building dnsrace: %v\n%s", err, out)
	}
	return exe
}

// TestRunsPerUnit runs the count pass of every cost case in the tier under
// test (DNSRACE_TEST_TIER; default tracepoint) and holds the design to its
// counts: each program may run at most once at each hook point its path
// crosses, and nowhere else. Counts hold under emulation, so the VM
// matrix runs it in every tier on every kernel; each case is logged as a
// RUNS line (cmd/vmtest collects them), with the programs' time beside
// the counts: a time holds for the machine it was read on only, and in a
// guest under qemu TCG times the emulator.
//
// The lab (internal/lab): pod0 - veth - br0 on the node - routed - veth -
// the dns namespace. A forwarded packet crosses two egress devices (pod0's
// eth0, the node's uplink) and three ingress ones (the node's pod0 port,
// br0, the dns namespace's eth0); an answer three egress (the dns
// namespace's eth0, br0, the node's pod0 port) and two ingress. The node
// NATs, so in the tracepoint tier on 6.4+ the netfilter program is linked
// there and runs at its POSTROUTING for every packet it forwards.
func TestRunsPerUnit(t *testing.T) {
	testutil.RequireRoot(t)
	tier := os.Getenv("DNSRACE_TEST_TIER")
	if tier == "" {
		tier = "tracepoint"
	}
	if tier == "fentry" {
		if limit := testutil.FentryLimit(); limit != "" {
			t.Skipf("no fentry tier on this kernel: %s (the trace suites assert the fallback)", limit)
		}
	}
	cfg := Config{
		Exe:           dnsraceBinary(t),
		CountOnly:     true,
		CountDuration: time.Duration(testutil.EnvInt(t, "DNSRACE_TEST_COUNT_SECONDS", 1, 1)) * time.Second,
		Attach:        tier,
		Log:           os.Stderr,
	}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Cases) != len(Cases) {
		t.Fatalf("%d cases counted, want %d", len(res.Cases), len(Cases))
	}
	netfilter := features.HaveProgramType(ebpf.Netfilter) == nil
	t.Log("RUNS lines: runs per unit; ns_per_unit and a program's @ns are run_time_ns (the statistics' clock reads included): " +
		"this machine's time, and under emulation (qemu TCG) the emulator's, not a measurement of any hardware")
	for _, c := range res.Cases {
		r := c.Runs
		if r == nil || r.Invalid || r.Units < 100 {
			t.Errorf("%s: no valid count: %s", c.Name, runsLine(r))
			continue
		}
		t.Log(runsRecord(kconfig.Release(), tier, c.Name, r))
		for _, p := range r.Programs {
			// The machine's own traffic meanwhile (a guest's neighbour
			// discovery, say) may add a few runs to any program.
			limit := runBound(tier, c, r, p.Name, netfilter) + background/r.Units
			if got := float64(p.Runs) / r.Units; got > limit {
				t.Errorf("%s, %s tier: %s ran %.3f times per %s, the design allows %.3f", c.Name, tier, p.Name, got, r.Unit, limit)
			}
		}
	}
}

// runsRecord is one case's counts and times on one line, for cmd/vmtest:
// RUNS kernel=K tier=T case=C unit=U total=N ns_per_unit=NS prog=N@NSns ...
// (runs per unit; the programs' time per unit; each program's runs per
// unit at its time per run).
func runsRecord(kernel, tier, name string, r *Runs) string {
	var b strings.Builder
	fmt.Fprintf(&b, "RUNS kernel=%s tier=%s case=%s unit=%s total=%.2f ns_per_unit=%.0f", kernel, tier, name, r.Unit, r.PerUnit, r.NsPerUnit)
	progs := append([]ProgStat(nil), r.Programs...)
	sort.Slice(progs, func(i, j int) bool { return progs[i].Name < progs[j].Name })
	for _, p := range progs {
		fmt.Fprintf(&b, " %s=%.2f@%.0fns", p.Name, float64(p.Runs)/r.Units, p.NsPerRun)
	}
	return b.String()
}

// slack covers other traffic on the machine during the pass, per unit;
// background in runs, whatever the units (a slow loop counts few).
const (
	slack      = 0.02
	background = 20
)

// runBound is how often program prog may run per unit of case c: once per
// hook point on the path, per packet that takes it.
func runBound(tier string, c CaseResult, r *Runs, prog string, netfilter bool) float64 {
	// Drops run the drop hooks once each; a flood's drops are what it
	// sent beyond what its sink took (packets) or was answered (queries).
	drops := 0.0
	switch {
	case c.Path == "syscall":
	case c.DNS:
		drops = (r.Sent - r.Units) / r.Units
	default:
		drops = (r.Sent - r.Delivered) / r.Units
	}
	if strings.Contains(prog, "kfree_skb") || strings.Contains(prog, "udp_fail_queue_rcv_skb") {
		return drops + slack
	}
	if slabFreeProg(prog) {
		// Every slab free: only where the netfilter program cannot load
		// (before 6.4), and then unbounded by the design.
		if tier == "tracepoint" && !netfilter {
			return 1e9
		}
		return slack
	}
	if c.Path == "syscall" {
		return slack // nothing else runs where no packet goes
	}
	// per unit: a packet is one way; a DNS unit is an answered query, and
	// the responder answers every query it takes, answered in the end or
	// not, so each query sent may cross the query's hops and the answer's
	hops := func(query, answer float64) float64 {
		if !c.DNS {
			return query + slack
		}
		return (query+answer)*r.Sent/r.Units + slack
	}
	// A packet hook also sees the ICMP error a late answer draws from the
	// flood's closed socket: it takes the query's way back, once for each
	// query sent but not answered in time at most (the count waits for the
	// flood's last packets).
	path := func(query, answer float64) float64 {
		if !c.DNS {
			return hops(query, answer)
		}
		return hops(query, answer) + query*(r.Sent-r.Units)/r.Units
	}
	fwd := c.Path == "forward"
	switch {
	case strings.HasSuffix(prog, "udp_sendmsg") || strings.HasSuffix(prog, "udpv6_sendmsg"):
		return hops(1, 1) // the sender's socket; the responder's
	case strings.HasSuffix(prog, "skb_consume_udp"):
		return hops(1, 1) // the sink's or responder's socket; the asker's
	case strings.Contains(prog, "nf_conntrack_confirm") || strings.Contains(prog, "nf_ct_resolve_clash"):
		// a flood's sockets keep their 5-tuple: one new entry each
		return slack
	case prog == "tp_net_dev_queue" && fwd:
		return path(2, 3)
	case prog == "tp_net_dev_queue":
		return path(1, 1) // lo
	case prog == "tp_netif_receive_skb" && fwd:
		return path(3, 2)
	case prog == "tp_netif_receive_skb":
		return path(1, 1)
	case prog == "nf_confirm_soon" && fwd:
		return path(1, 1) // the node's POSTROUTING
	case prog == "nf_confirm_soon":
		return slack // the pods do not NAT: not watched there
	}
	return slack // a program this case should not run
}

// TestRunsRecord: a RUNS line as cmd/vmtest parses it (internal/vmtest,
// console.go), programs by name.
func TestRunsRecord(t *testing.T) {
	r := progRuns("query", 1000, ProgStat{Name: "tp_net_dev_queue", Runs: 5000, RunTimeNs: 1_500_000, NsPerRun: 300},
		ProgStat{Name: "nf_confirm_soon", Runs: 2000, RunTimeNs: 250_000, NsPerRun: 125})
	want := "RUNS kernel=6.12.48 tier=tracepoint case=dns-forward unit=query total=7.00 ns_per_unit=1750 " +
		"nf_confirm_soon=2.00@125ns tp_net_dev_queue=5.00@300ns"
	if got := runsRecord("6.12.48", "tracepoint", "dns-forward", r); got != want {
		t.Errorf("RUNS line\n got %q\nwant %q", got, want)
	}
}
