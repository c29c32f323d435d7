package doctor

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/ctentry"
	"github.com/dnsrace/dnsrace/internal/natrules"
)

// Saved conntrack entries (`conntrack -L`) read when doctor does not look
// at the live kernel, and the kernel's own text table (only with
// CONFIG_NF_CONNTRACK_PROCFS).
const (
	savedConntrack = "/var/lib/dnsrace/conntrack.txt"
	procConntrack  = "/proc/net/nf_conntrack"
)

// staleEntry is a UDP conntrack entry to a DNS VIP whose NAT target is
// not among the VIP's current backends.
type staleEntry struct {
	label, nsPath string // where: "host" and "", or the --netns path twice
	entry         ctentry.Entry
	backends      []netip.AddrPort
	live          bool // read over ctnetlink, which has start times
}

// deleteCommand is the command that deletes the entry (ctentry.DeleteCommand).
func (s staleEntry) deleteCommand() string { return ctentry.DeleteCommand(s.nsPath, s.entry.Orig) }

// describe says where the entry sends packets and why that is stale.
func (s staleEntry) describe() string {
	e := s.entry
	where := fmt.Sprintf("still goes to %s", e.DNATTarget())
	if e.Status&ctentry.DstNAT == 0 && e.DNATTarget() == e.Orig.Dst {
		where = "goes to the VIP itself, not DNATed (made while no rule DNATed the VIP)"
	}
	age := "age unknown (not in conntrack -L text)"
	if s.live {
		age = "age unknown (net.netfilter.nf_conntrack_timestamp was off)"
	}
	if !e.Start.IsZero() {
		age = "age " + time.Since(e.Start).Round(time.Second).String()
	}
	return fmt.Sprintf("%s: %s %s (reply %s), not a current backend (%s); %s left, %s, %s",
		s.label, e.Orig, where, e.Reply, joinAddrPorts(s.backends), e.Timeout, age, e.Status)
}

func joinAddrPorts(as []netip.AddrPort) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

// udpDNS returns the services that take DNS over UDP.
func udpDNS(t *natrules.Table) []natrules.Service {
	var out []natrules.Service
	for _, s := range t.DNS() {
		if s.Proto == 0 || s.Proto == unix.IPPROTO_UDP {
			out = append(out, s)
		}
	}
	return out
}

// dnsEntry keeps the UDP entries to a DNS VIP of t.
func dnsEntry(t *natrules.Table) func(ctentry.Entry) bool {
	return func(e ctentry.Entry) bool {
		if e.Orig.Proto != unix.IPPROTO_UDP || e.Orig.Dst.Port() != natrules.DNSPort {
			return false
		}
		_, _, ok := t.Backends(e.Orig.Dst, unix.IPPROTO_UDP)
		return ok
	}
}

// natInput is one namespace's rules and DNS entries, read together.
type natInput struct {
	label, path string
	table       *natrules.Table
	entries     []ctentry.Entry
	from        string // where the entries came from
}

// liveNATInput reads a namespace's rules and then its entries, live.
func liveNATInput(ctx context.Context, label, nsPath string) (natInput, error) {
	in := natInput{label: label, path: nsPath, from: "ctnetlink"}
	err := withTimeout(liveTimeout, "reading NAT rules", func() (err error) {
		in.table, err = natrules.Read(ctx, nsPath)
		return err
	})
	if err != nil || len(udpDNS(in.table)) == 0 {
		return in, err
	}
	err = withTimeout(liveTimeout, "dumping conntrack entries over ctnetlink", func() (err error) {
		in.entries, err = ctentry.Dump(nsPath, dnsEntry(in.table))
		return err
	})
	return in, err
}

// savedNATInput reads the host's rules and entries from dumps under the
// root (or the --iptables-save file): doctor's offline mode.
func (e *env) savedNATInput(probs *problems) (natInput, bool) {
	in := natInput{label: "host"}
	name := e.IptablesSave
	var data []byte
	var err error
	switch {
	case name != "":
		data, err = readCapped(name)
	case e.exists(savedIptables):
		name = savedIptables
		data, _, err = e.read(savedIptables)
	default:
		if e.NftRuleset != "" || e.exists(savedNft) {
			probs.addf("the NAT rules are only in an nft text dump, which this check does not read (run it live)")
		} else {
			probs.addf("no NAT rules to read: run on the node (live), or save iptables-save output to %s", savedIptables)
		}
		return in, false
	}
	if err != nil {
		probs.addf("iptables dump %s: %v", name, unwrapPathErr(err))
		return in, false
	}
	in.table = natrules.ParseIptablesSave(name, string(data))
	if len(udpDNS(in.table)) == 0 {
		return in, true
	}
	for _, p := range []string{savedConntrack, procConntrack} {
		if !e.exists(p) {
			continue
		}
		b, _, err := e.read(p)
		if err != nil {
			probs.addf("conntrack entries %s: %v", p, unwrapPathErr(err))
			return in, false
		}
		all, bad := ctentry.ParseList(string(b))
		if bad > 0 {
			probs.addf("%s: %d line(s) not understood", p, bad)
		}
		keep := dnsEntry(in.table)
		for _, en := range all {
			if keep(en) {
				in.entries = append(in.entries, en)
			}
		}
		in.from = p
		return in, true
	}
	probs.addf("no conntrack entries to read: run on the node (live), or save `conntrack -L -p udp` output to %s", savedConntrack)
	return in, false
}

// checkStaleNAT: does a UDP conntrack entry to a DNS VIP still send its
// packets to a backend the NAT rules no longer name? A client that keeps
// one source port (a node-local cache's forwarder, c-ares, any long-lived
// socket) refreshes its entry with every query, so the entry outlives the
// backend it was made for unless someone deletes it: kube-proxy should,
// for the UDP entries of removed endpoints; when it does not, every query
// goes to an address that is gone.
func checkStaleNAT(ctx context.Context, e *env) Result {
	var r Result
	var probs problems
	var inputs []natInput
	if e.Live {
		targets := [][2]string{{"host", ""}}
		for _, p := range e.NetNS {
			targets = append(targets, [2]string{p, p})
		}
		for _, t := range targets {
			in, err := liveNATInput(ctx, t[0], t[1])
			if err != nil {
				probs.addf("%s: %v", t[0], err)
				continue
			}
			inputs = append(inputs, in)
		}
	} else {
		for _, p := range e.NetNS {
			probs.addf("%s: reading another namespace needs --live", p)
		}
		if in, ok := e.savedNATInput(&probs); ok {
			inputs = append(inputs, in)
		}
	}

	var stale []staleEntry
	checked, total := 0, 0
	for _, in := range inputs {
		dns := udpDNS(in.table)
		if len(dns) == 0 {
			r.Evidence = append(r.Evidence, fmt.Sprintf("%s: no NAT rule DNATs a DNS VIP (%d services; %s)",
				in.label, len(in.table.Services()), strings.Join(in.table.Sources, "; ")))
			continue
		}
		checked++
		for _, s := range dns {
			r.Evidence = append(r.Evidence, fmt.Sprintf("%s: %s DNATs to %s (%s)", in.label, s.Key(), joinAddrPorts(s.Backends), s.Source))
		}
		for _, n := range in.table.Notes {
			r.Evidence = append(r.Evidence, in.label+": rules: "+n)
		}
		n := 0
		for _, en := range in.entries {
			n++
			backends, _, _ := in.table.Backends(en.Orig.Dst, unix.IPPROTO_UDP)
			if !slices.Contains(backends, en.DNATTarget()) {
				stale = append(stale, staleEntry{label: in.label, nsPath: in.path, entry: en, backends: backends, live: e.Live})
			}
		}
		total += n
		r.Evidence = append(r.Evidence, fmt.Sprintf("%s (%s): %d UDP entries to those VIPs", in.label, in.from, n))
	}
	if checked == 0 {
		if len(probs) > 0 {
			return Result{Verdict: Skip, Reason: strings.Join(probs, "; "), Evidence: r.Evidence}
		}
		return Result{Verdict: Skip, Reason: "no NAT rule DNATs a DNS VIP (port 53) in the namespaces read", Evidence: r.Evidence}
	}
	if len(stale) == 0 {
		r.Verdict = OK
		r.Summary = fmt.Sprintf("%d UDP conntrack entr%s to DNS VIPs, all going to current backends (%d namespace(s))",
			total, plural(total, "y", "ies"), checked)
		return probs.finish(r)
	}

	r.Verdict = Warn
	var targets, cmds []string
	for _, s := range stale {
		r.Evidence = append(r.Evidence, "STALE "+s.describe(), "  delete: "+s.deleteCommand())
		t := fmt.Sprintf("%s (%s)", s.entry.DNATTarget(), s.label)
		if !slices.Contains(targets, t) {
			targets = append(targets, t)
		}
		if len(cmds) < 3 {
			cmds = append(cmds, s.deleteCommand())
		}
	}
	if len(stale) > len(cmds) {
		cmds = append(cmds, fmt.Sprintf("and the %d more in the evidence", len(stale)-len(cmds)))
	}
	r.Summary = fmt.Sprintf("%d UDP conntrack entr%s to a DNS VIP still go%s to a backend the NAT rules no longer name: %s",
		len(stale), plural(len(stale), "y", "ies"), plural(len(stale), "es", ""), strings.Join(targets, ", "))
	r.Fix = "delete the stale entries; the client's next query then takes the current rules: " + strings.Join(cmds, "; ") +
		". kube-proxy is supposed to delete the UDP entries of removed endpoints itself (kubernetes#125467): " +
		"if new ones keep appearing, look for conntrack cleanup errors in its log"
	return probs.finish(r)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
