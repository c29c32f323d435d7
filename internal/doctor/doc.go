// Package doctor checks a Kubernetes node for the configurations that make
// DNS lookups stall for one resolver timeout (5 s), or fail outright.
//
// The contract:
//
//   - Every check is independent and returns exactly one Result with a stable
//     id, a verdict (ok, warn, fail, skip), a one-line summary, the evidence it
//     read (paths and the lines that mattered) and, for warn and fail, a fix.
//   - A check that cannot read or parse an input it needs returns skip with
//     the reason. It never reports ok on partial input, and a panic inside a
//     check is turned into a skip: doctor itself does not crash on a node.
//   - Every path is read relative to Config.Root, so the same code runs on
//     the node ("/"), from `kubectl debug node` ("/host") and against the
//     fixture trees in testdata/. Symbolic links inside the root are followed
//     within the root (an absolute target is re-rooted), except the kernel's
//     magic links under /proc/PID/root, which the kernel follows itself.
//   - Live-only inputs (netlink, BPF program loads, iptables-save, nftables)
//     are used only when Config.Live is set; otherwise the parts that need them
//     are skipped with the reason, or read from saved dumps
//     (Config.IptablesSave, Config.NftRuleset, or var/lib/dnsrace/ under Root;
//     stale-nat reads saved `conntrack -L` output from
//     var/lib/dnsrace/conntrack.txt, or proc/net/nf_conntrack).
//
// The checks: resolvers, bridge-takeover, conntrack, kernel-fix, kube-proxy,
// stale-nat, pod-resolvers, tracing. Report.Exit is 0 when every check is ok or skip, 1
// when any warns or fails.
package doctor
