package natrules

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// SavedRule is one "-A CHAIN ..." line of iptables-save output.
type SavedRule struct {
	Table string // "nat", "filter", "raw", ...
	Chain string
	// Words is the whole line split as the shell would ("-A", the chain,
	// then every option and value, the quotes of comments removed).
	Words []string
}

// SplitSave reads iptables-save output (several dumps may be
// concatenated) into its rules, in order, and the chains each table
// declares. Malformed lines are skipped: the text is machine-written, so
// the reader only needs to be robust, not strict.
func SplitSave(text string) []SavedRule {
	rules, _ := splitSave(text)
	return rules
}

func splitSave(text string) ([]SavedRule, map[string][]string) {
	var rules []SavedRule
	declared := map[string][]string{} // table -> chains, from ":CHAIN POLICY [p:b]"
	table := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
		case strings.HasPrefix(line, ":"):
			if f := strings.Fields(line[1:]); len(f) > 0 {
				declared[table] = append(declared[table], f[0])
			}
		case strings.HasPrefix(line, "-A "):
			w := SplitArgs(line)
			if len(w) < 2 {
				continue
			}
			rules = append(rules, SavedRule{Table: table, Chain: w[1], Words: w})
		}
	}
	return rules, declared
}

// SplitArgs splits an iptables-save rule line into words, honouring the
// double quotes (and backslash escapes inside them) iptables-save puts
// around comments.
func SplitArgs(line string) []string {
	var out []string
	var cur strings.Builder
	inQ, have := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\\' && inQ && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case c == '"':
			inQ, have = !inQ, true
		case (c == ' ' || c == '\t') && !inQ:
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(c)
			have = true
		}
	}
	if have {
		out = append(out, cur.String())
	}
	return out
}

// Dump is the output of one iptables-save variant.
type Dump struct {
	Tool string // "iptables-nft-save", "iptables-legacy-save", "iptables-save", the ip6tables ones
	Text string
}

// SaveIptables runs the iptables-save variants this machine has in the
// network namespace at netnsPath ("" = the caller's): both the legacy and
// the nft one when both exist (a node may have rules in either, or both),
// else plain iptables-save; the ip6tables ones when ipv6 is set. The error
// says which variants failed or that none exists; dumps of those that ran
// come back alongside it.
func SaveIptables(ctx context.Context, netnsPath string, ipv6 bool) ([]Dump, error) {
	prefix := "iptables"
	if ipv6 {
		prefix = "ip6tables"
	}
	var tools []string
	for _, t := range []string{prefix + "-legacy-save", prefix + "-nft-save"} {
		if _, err := exec.LookPath(t); err == nil {
			tools = append(tools, t)
		}
	}
	if len(tools) == 0 {
		if _, err := exec.LookPath(prefix + "-save"); err == nil {
			tools = []string{prefix + "-save"}
		}
	}
	if len(tools) == 0 {
		return nil, fmt.Errorf("no %s-save in PATH", prefix)
	}
	var dumps []Dump
	var errs []error
	for _, t := range tools {
		var out, stderr bytes.Buffer
		err := nsutil.DoPath(netnsPath, func() error {
			cmd := exec.CommandContext(ctx, t)
			cmd.Stdout, cmd.Stderr = &out, &stderr
			return cmd.Run()
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("running %s: %w: %s", t, err, strings.TrimSpace(stderr.String())))
			continue
		}
		dumps = append(dumps, Dump{Tool: t, Text: out.String()})
	}
	return dumps, errors.Join(errs...)
}

// ParseIptablesSave reads the nat table of iptables-save (or
// ip6tables-save) output and returns what its PREROUTING and OUTPUT
// chains DNAT. source names the dump in Service.Source ("iptables-nft-save").
func ParseIptablesSave(source, text string) *Table {
	t := newTable()
	saved, declared := splitSave(text)
	rs := &ruleset{source: source + " nat", chains: map[string]*chain{}, entries: []string{"PREROUTING", "OUTPUT"}}
	for _, c := range declared["nat"] {
		rs.chains[c] = &chain{name: c}
	}
	n := 0
	for _, r := range saved {
		if r.Table != "nat" {
			continue
		}
		if rs.chains[r.Chain] == nil {
			rs.chains[r.Chain] = &chain{name: r.Chain}
		}
		n++
	}
	w := &walker{rs: rs}
	for _, r := range saved {
		if r.Table != "nat" {
			continue
		}
		c := rs.chains[r.Chain]
		c.rules = append(c.rules, iptRule(r.Words, rs.chains, w))
	}
	for _, e := range rs.entries {
		if rs.chains[e] == nil {
			rs.chains[e] = &chain{name: e}
		}
	}
	w.found = func(p pkt, to netip.AddrPort) { t.add(rs.source, p, to) }
	w.run()
	t.Sources = append(t.Sources, fmt.Sprintf("%s: %d nat rules", source, n))
	t.Notes = append(t.Notes, w.notes...)
	return t
}

// iptRule turns one rule's words into conditions and an action. Matches
// it cannot decide (source, interface, mark, statistic, addrtype, ...)
// become "maybe" conditions, so the walk takes both ways.
func iptRule(words []string, chains map[string]*chain, w *walker) rule {
	var conds []cond
	var ports []cond // -m multiport --dports: one path each
	var act action
	target, toDest := "", ""
	isGoto, inTarget, neg := false, false, false
	add := func(c cond) {
		if neg {
			c = c.not()
		}
		conds = append(conds, c)
	}
	arg := func(i int) string {
		if i+1 < len(words) {
			return words[i+1]
		}
		return ""
	}
	for i := 2; i < len(words); i++ {
		tok := words[i]
		if tok == "!" {
			neg = true
			continue
		}
		switch tok {
		case "-d", "--destination":
			if pfx, err := parsePrefix(arg(i)); err == nil {
				add(cond{kind: condAddr, prefix: pfx})
			} else {
				add(maybeCond())
			}
			i++
		case "-p", "--protocol":
			if p, ok := protoNumber(arg(i)); ok && p != 0 {
				add(protoCond(p))
			} else if !ok || neg {
				add(maybeCond())
			}
			i++
		case "-m", "--match":
			switch arg(i) {
			case "comment", "udp", "tcp", "sctp", "multiport":
			default:
				add(maybeCond())
			}
			i++
		case "--dport", "--destination-port":
			if c, ok := parsePortCond(arg(i)); ok {
				add(c)
			} else {
				add(maybeCond())
			}
			i++
		case "--dports", "--destination-ports":
			ports = nil
			for _, s := range strings.Split(arg(i), ",") {
				c, ok := parsePortCond(s)
				if !ok || neg {
					ports = nil
					add(maybeCond())
					break
				}
				ports = append(ports, c)
			}
			i++
		case "--comment":
			i++
		case "-j", "--jump", "-g", "--goto":
			target, isGoto, inTarget = arg(i), tok == "-g" || tok == "--goto", true
			i++
		case "--to-destination":
			toDest = arg(i)
			i++
		default:
			// An option of a match the walker does not decide (-s, -i,
			// --sport, --mode, ...), or of the target; its values follow
			// and are skipped as words that do not start with "-".
			if strings.HasPrefix(tok, "-") && !inTarget {
				conds = append(conds, maybeCond())
			}
		}
		neg = false
	}
	switch {
	case target == "DNAT":
		to, exact, err := parseToDestination(toDest)
		if err != nil {
			w.note("%s: DNAT %q not understood", strings.Join(words[:2], " "), toDest)
			act = action{kind: actStop}
			break
		}
		if !exact {
			w.note("%s: DNAT to a range %q: only its first address and port are taken", strings.Join(words[:2], " "), toDest)
		}
		act = action{kind: actDNAT, to: to}
	case target == "ACCEPT" || target == "DROP" || target == "REJECT":
		act = action{kind: actStop}
	case target == "RETURN":
		act = action{kind: actReturn}
	case target == "REDIRECT":
		// A DNAT to the receiving interface's own address: not a backend
		// the rules name.
		w.note("%s: REDIRECT: its target address is not in the rules", strings.Join(words[:2], " "))
		act = action{kind: actStop}
	case chains[target] != nil && isGoto:
		act = action{kind: actGoto, chain: target}
	case chains[target] != nil:
		act = action{kind: actJump, chain: target}
	}
	if len(ports) == 0 {
		return rule{paths: []path{{conds: conds, act: act}}}
	}
	var r rule
	for _, pc := range ports {
		r.paths = append(r.paths, path{conds: append(append([]cond(nil), conds...), pc), act: act})
	}
	return r
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			// iptables-save writes host masks as /32 but older versions
			// wrote dotted masks (/255.255.255.0).
			a, m, _ := strings.Cut(s, "/")
			addr, err1 := netip.ParseAddr(a)
			mask, err2 := netip.ParseAddr(m)
			if err1 != nil || err2 != nil || !mask.Is4() {
				return netip.Prefix{}, err
			}
			b := mask.As4()
			bits := 0
			for _, x := range b {
				for x&0x80 != 0 {
					bits++
					x <<= 1
				}
			}
			return addr.Prefix(bits)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func protoNumber(s string) (uint8, bool) {
	switch strings.ToLower(s) {
	case "all", "0":
		return 0, true
	case "udp":
		return unix.IPPROTO_UDP, true
	case "tcp":
		return unix.IPPROTO_TCP, true
	case "sctp":
		return unix.IPPROTO_SCTP, true
	case "icmp":
		return unix.IPPROTO_ICMP, true
	case "ipv6-icmp", "icmpv6":
		return unix.IPPROTO_ICMPV6, true
	}
	n, err := strconv.ParseUint(s, 10, 8)
	return uint8(n), err == nil
}

// parsePortCond reads "53" or a range "50:60".
func parsePortCond(s string) (cond, bool) {
	lo, hi, isRange := strings.Cut(s, ":")
	a, err := strconv.ParseUint(lo, 10, 16)
	if err != nil {
		return cond{}, false
	}
	b := a
	if isRange {
		if b, err = strconv.ParseUint(hi, 10, 16); err != nil || b < a {
			return cond{}, false
		}
	}
	if a == 0 && b == 0 {
		return cond{}, false
	}
	return cond{kind: condPort, port: uint16(a), portHi: uint16(b)}, true
}

// parseToDestination reads a DNAT target: "ADDR", "ADDR:PORT",
// "[ADDR6]:PORT", "ADDR6", and ranges "A-B", ":P1-P2" (exact is false then,
// and the first of each range is returned).
func parseToDestination(s string) (to netip.AddrPort, exact bool, err error) {
	exact = true
	host, port := s, ""
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.Index(s, "]")
		if end < 0 {
			return to, false, fmt.Errorf("no ] in %q", s)
		}
		host, port = s[1:end], strings.TrimPrefix(s[end+1:], ":")
	case strings.Count(s, ":") == 1:
		host, port, _ = strings.Cut(s, ":")
	}
	if a, _, isRange := strings.Cut(host, "-"); isRange {
		host, exact = a, false
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return to, false, err
	}
	var p uint64
	if port != "" {
		if a, _, isRange := strings.Cut(port, "-"); isRange {
			port, exact = a, false
		}
		if p, err = strconv.ParseUint(port, 10, 16); err != nil {
			return to, false, err
		}
	}
	return netip.AddrPortFrom(addr, uint16(p)), exact, nil
}
