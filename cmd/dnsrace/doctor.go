package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/dnsrace/dnsrace/internal/doctor"
)

func init() {
	commands["doctor"] = command{
		summary: "check a node for the configurations behind 5 s DNS stalls",
		run:     runDoctor,
	}
}

const doctorHelp = `Usage: dnsrace doctor [--root DIR] [--live] [--json] [--netns PATH]... [--check ID]...

Runs independent checks on a Kubernetes node and prints one verdict per check
(ok, warn, fail, skip with the reason), the evidence it read and the fix.

Checks:
  resolvers        /etc/resolv.conf (and systemd-resolved's uplink list, kubelet's
                   resolvConf) has a usable nameserver
  bridge-takeover  the uplink (eth0) is a port of a CNI bridge (azure0, cbr0) while
                   systemd-networkd manages it; Azure CNI mode from /etc/cni/net.d
  conntrack        per-CPU insert_failed, drop, early_drop, clash_resolve and table
                   fill, in the host namespace and each --netns
  kernel-fix       which conntrack race classes this kernel resolves (release, BTF,
                   kallsyms) and which still drop
  kube-proxy       random DNAT of the DNS VIP over several endpoints, source NAT
                   without --random-fully, NodeLocal DNSCache
  stale-nat        UDP conntrack entries to a DNS VIP that still go to a backend
                   the NAT rules no longer name (kube-proxy did not delete them),
                   in the host namespace and each --netns
  pod-resolvers    containers' resolv.conf options and libc (glibc/musl), grouped
  tracing          the attach tier dnsrace trace would get (fentry, kprobe,
                   tracepoint) and why

Exit status: 0 every check ok or skipped, 1 a check warned or failed, 2 doctor
could not run (bad flags).

Flags:
%s
Examples:
  # on the node itself (as root)
  sudo dnsrace doctor

  # from 'kubectl debug node/NAME -it --image=...': the host is mounted at /host;
  # the debug pod shares the host network, so live checks still work
  dnsrace doctor --root /host --live

  # conntrack and NAT rules of another namespace too, as JSON
  sudo dnsrace doctor --netns /run/netns/node1 --netns /proc/4242/ns/net --json

  # offline, against a copy of a node's files and saved rule dumps
  dnsrace doctor --root ./node-copy --iptables-save iptables.txt --nft-ruleset nft.txt
`

func runDoctor(ctx context.Context, args []string) error {
	return doctorMain(ctx, args, os.Stdout, os.Stderr)
}

func doctorMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("doctor", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var (
		cfg     doctor.Config
		asJSON  bool
		live    bool
		noLive  bool
		maxEv   int
		checks  []string
		netns   []string
		showHlp bool
	)
	fs.StringVar(&cfg.Root, "root", "/", "host root directory; every path is read below it (kubectl debug node: /host)")
	fs.BoolVar(&live, "live", false, "also use netlink, iptables-save and BPF trial loads (default: on when --root is /)")
	fs.BoolVar(&noLive, "no-live", false, "never touch the running kernel; read files only")
	fs.BoolVar(&asJSON, "json", false, "print one JSON document instead of text")
	fs.StringArrayVar(&netns, "netns", nil, "also check this network namespace (/run/netns/NAME, /proc/PID/ns/net, or a bare NAME); repeatable")
	fs.StringVar(&cfg.IptablesSave, "iptables-save", "", "read this iptables-save dump instead of the live rules")
	fs.StringVar(&cfg.NftRuleset, "nft-ruleset", "", "read this 'nft list ruleset' dump instead of the live rules")
	fs.StringArrayVar(&checks, "check", nil, "run only this check (repeatable): "+strings.Join(doctor.CheckIDs(), ", "))
	fs.IntVar(&maxEv, "max-evidence", 40, "evidence lines shown per check")
	fs.BoolVarP(&showHlp, "help", "h", false, "show this help")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintf(stdout, doctorHelp, fs.FlagUsages())
			return nil
		}
		return usagef("%v (see dnsrace doctor --help)", err)
	}
	if showHlp {
		fmt.Fprintf(stdout, doctorHelp, fs.FlagUsages())
		return nil
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q (see dnsrace doctor --help)", fs.Arg(0))
	}
	if live && noLive {
		return usagef("--live and --no-live exclude each other")
	}
	if fi, err := os.Stat(cfg.Root); err != nil || !fi.IsDir() {
		return usagef("--root %s: not a directory", cfg.Root)
	}
	for _, f := range []string{cfg.IptablesSave, cfg.NftRuleset} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			return usagef("reading dump: %v", err)
		}
	}
	cfg.Live = live || (!noLive && (cfg.Root == "/" || cfg.Root == ""))
	if len(netns) > 0 && !cfg.Live {
		return usagef("--netns needs live access to the kernel (drop --no-live, or add --live with --root)")
	}
	for i, p := range netns {
		// A bare name means an iproute2 named namespace.
		if !strings.Contains(p, "/") {
			p = "/run/netns/" + p
			netns[i] = p
		}
		if _, err := os.Stat(p); err != nil {
			return usagef("--netns %s: %v", p, err)
		}
	}
	if cfg.Live && os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "dnsrace doctor: not root: netlink and BPF parts will be skipped or fall back to files")
	}
	cfg.NetNS = netns
	cfg.Checks = checks
	cfg.MaxEvidence = maxEv

	rep, err := doctor.Run(ctx, cfg)
	if err != nil {
		if errors.Is(err, doctor.ErrUnknownCheck) {
			return usagef("%v", err)
		}
		return fmt.Errorf("running checks: %w", err)
	}
	if asJSON {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		return err
	}
	if rep.Exit != 0 {
		return exitCodeError{rep.Exit}
	}
	return nil
}
