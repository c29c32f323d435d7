package doctor

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
)

const (
	savedIptables = "/var/lib/dnsrace/iptables-save.txt"
	savedNft      = "/var/lib/dnsrace/nft-ruleset.txt"
)

// hostRules gathers the host namespace's rules from, in order of
// preference: the dump files given on the command line, dumps saved under
// the root, the live kernel.
func (e *env) hostRules(ctx context.Context, probs *problems) (ruleFacts, []string, int) {
	var f ruleFacts
	var ev []string
	sources := 0
	readDump := func(label, given, saved string, parse func(string, string) ruleFacts) bool {
		var data []byte
		var err error
		name := given
		switch {
		case given != "":
			data, err = readCapped(given)
		case e.exists(saved):
			name = saved
			data, _, err = e.read(saved)
		default:
			return false
		}
		if err != nil {
			probs.addf("%s dump %s: %v", label, name, unwrapPathErr(err))
			return true
		}
		rf := parse(name, string(data))
		ev = append(ev, fmt.Sprintf("%s: %d %s rules", name, rf.RuleSeen, label))
		if rf.RuleSeen == 0 {
			probs.addf("%s dump %s has no rules", label, name)
			return true
		}
		f.merge(rf)
		sources++
		return true
	}
	if !readDump("iptables", e.IptablesSave, savedIptables, parseIptablesSave) && e.Live {
		rf, notes, err := liveIptables(ctx, "")
		ev = append(ev, notes...)
		if err != nil {
			ev = append(ev, "iptables: "+err.Error())
		} else {
			f.merge(rf)
			sources++
		}
	}
	if !readDump("nft", e.NftRuleset, savedNft, parseNftText) && e.Live {
		rf, err := liveNft("")
		if err != nil {
			ev = append(ev, "nftables: "+err.Error())
		} else {
			ev = append(ev, fmt.Sprintf("nftables (netlink): %d native rules", rf.RuleSeen))
			f.merge(rf)
			sources++
		}
	}
	return f, ev, sources
}

// checkKubeProxy: does the DNS VIP's DNAT pick among several endpoints at
// random per packet (the race only 5.6+ resolves), does source NAT run
// without --random-fully (the reply-tuple race no kernel resolves), and is
// NodeLocal DNSCache there to take pods' DNS out of conntrack?
func checkKubeProxy(ctx context.Context, e *env) Result {
	var probs problems
	var r Result
	f, ev, sources := e.hostRules(ctx, &probs)
	for i := range f.LB {
		f.LB[i].Source = "host " + f.LB[i].Source
	}
	for i := range f.NAT {
		f.NAT[i].Source = "host " + f.NAT[i].Source
	}
	r.Evidence = append(r.Evidence, ev...)
	for _, ns := range e.NetNS {
		if !e.Live {
			probs.addf("%s: reading another namespace's rules needs --live", ns)
			continue
		}
		var nf ruleFacts
		ok := false
		if rf, notes, err := liveIptables(ctx, ns); err != nil {
			r.Evidence = append(r.Evidence, ns+": iptables: "+err.Error())
		} else {
			for _, n := range notes {
				r.Evidence = append(r.Evidence, ns+": "+n)
			}
			nf.merge(rf)
			ok = true
		}
		if rf, err := liveNft(ns); err != nil {
			r.Evidence = append(r.Evidence, ns+": nftables: "+err.Error())
		} else {
			r.Evidence = append(r.Evidence, fmt.Sprintf("%s: nftables (netlink): %d native rules", ns, rf.RuleSeen))
			nf.merge(rf)
			ok = true
		}
		if !ok {
			probs.addf("%s: no rules readable", ns)
			continue
		}
		for i := range nf.LB {
			nf.LB[i].Source = ns + " " + nf.LB[i].Source
		}
		for i := range nf.NAT {
			nf.NAT[i].Source = ns + " " + nf.NAT[i].Source
		}
		f.merge(nf)
		sources++
	}
	if sources == 0 {
		reason := "no NAT rules to read: run on the node (live), or pass --iptables-save FILE / --nft-ruleset FILE"
		if len(probs) > 0 {
			reason = strings.Join(probs, "; ")
		}
		return Result{Verdict: Skip, Reason: reason, Evidence: r.Evidence}
	}

	// NodeLocal DNSCache: its interface, and NOTRACK for its address.
	nodeLocal := false
	if _, err := os.Lstat(e.hostPath("/sys/class/net/nodelocaldns")); err == nil {
		nodeLocal = true
		r.Evidence = append(r.Evidence, "/sys/class/net/nodelocaldns: NodeLocal DNSCache interface present")
	}
	if e.Live && e.Root == "/" {
		if ifs, err := net.Interfaces(); err == nil {
			for _, ifc := range ifs {
				addrs, _ := ifc.Addrs()
				for _, a := range addrs {
					if pfx, err := netip.ParsePrefix(a.String()); err == nil && pfx.Addr().String() == nodeLocalIP {
						nodeLocal = true
						r.Evidence = append(r.Evidence, fmt.Sprintf("%s holds %s (NodeLocal DNSCache address)", ifc.Name, nodeLocalIP))
					}
				}
			}
		}
	}
	for _, n := range f.Notrack {
		nodeLocal = true
		r.Evidence = append(r.Evidence, "NOTRACK: "+n)
	}

	// IPVS mode keeps conntrack in the path too (docs/kernel.md §9): it rewrites
	// the reply tuple without NAT status bits, so before 6.12 clashing
	// entries merge even when IPVS picked different real servers.
	if _, err := os.Lstat(e.hostPath("/sys/class/net/kube-ipvs0")); err == nil {
		r.Evidence = append(r.Evidence, "/sys/class/net/kube-ipvs0: kube-proxy runs in IPVS mode (conntrack still sees every DNS packet; see kernel-fix for the IPVS merge caveat before 6.12)")
	}
	var dnsLB []lbChain
	others := 0
	for _, lb := range f.LB {
		if lb.DNS && lb.Endpoints >= 2 {
			dnsLB = append(dnsLB, lb)
			d := ""
			if lb.Desc != "" {
				d = " " + lb.Desc
			}
			r.Evidence = append(r.Evidence, fmt.Sprintf("%s: %s picks 1 of %d DNS endpoints at random per connection%s", lb.Source, lb.Chain, lb.Endpoints, d))
		} else {
			others++
		}
	}
	if others > 0 {
		r.Evidence = append(r.Evidence, fmt.Sprintf("%d other random load-balancing chain(s)", others))
	}
	var plainNAT []natRule
	for _, n := range f.NAT {
		state := "without --random-fully"
		switch {
		case n.FullyRandom:
			state = "fully random"
		case n.Random:
			state = "with --random (same as --random-fully since 5.0)"
		default:
			plainNAT = append(plainNAT, n)
		}
		r.Evidence = append(r.Evidence, fmt.Sprintf("%s: %s %s %s", n.Source, n.Where, n.Kind, state))
	}

	var issues, fixes []string
	switch {
	case len(dnsLB) > 0 && !nodeLocal:
		n := 0
		for _, lb := range dnsLB {
			n = max(n, lb.Endpoints)
		}
		issues = append(issues, fmt.Sprintf("DNS VIP DNATed at random over %d endpoints without NodeLocal DNSCache (A/AAAA can pick different backends: dropped before 5.6, see kernel-fix)", n))
		fixes = append(fixes, "deploy NodeLocal DNSCache (pods query 169.254.20.10, NOTRACK, TCP upstream)")
	case len(dnsLB) > 0:
		r.Evidence = append(r.Evidence, "NodeLocal DNSCache present: pods' queries skip the random DNAT")
	}
	if len(plainNAT) > 0 {
		issues = append(issues, fmt.Sprintf("%d source NAT rule(s) without --random-fully (reply-tuple port clash: drops on every kernel)", len(plainNAT)))
		fixes = append(fixes, "add --random-fully to MASQUERADE/SNAT (nft: masquerade fully-random); it lowers, not removes, the port-clash odds")
	}
	if len(issues) > 0 {
		r.Verdict = Warn
		r.Summary = strings.Join(issues, "; ")
		r.Fix = strings.Join(fixes, "; ")
	} else {
		r.Verdict = OK
		switch {
		case len(dnsLB) > 0:
			r.Summary = "random DNS DNAT is bypassed by NodeLocal DNSCache; source NAT is fully random"
		default:
			r.Summary = fmt.Sprintf("no random DNS DNAT over several endpoints, no source NAT without --random-fully (%d rules read)", f.RuleSeen)
		}
	}
	return probs.finish(r)
}
