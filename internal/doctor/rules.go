package doctor

import (
	"bufio"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/dnsrace/dnsrace/internal/natrules"
)

// ruleFacts is what the kube-proxy check needs from a node's NAT rules,
// whichever tool wrote them.
type ruleFacts struct {
	LB       []lbChain // random load-balancing over endpoints
	NAT      []natRule // MASQUERADE / SNAT
	Notrack  []string  // NOTRACK rules for NodeLocal DNSCache's address
	RuleSeen int       // rules parsed, to tell "no rules" from "no findings"
}

// lbChain is one service chain that picks an endpoint at random per new
// connection (iptables -m statistic --mode random, nft numgen random).
type lbChain struct {
	Source    string // "iptables-save", "nft", a file name
	Chain     string
	Endpoints int
	DNS       bool   // the kube-dns service, or dport 53
	Desc      string // VIP / comment when known
}

// natRule is one source NAT rule.
type natRule struct {
	Source      string
	Where       string // table/chain
	Kind        string // MASQUERADE, SNAT, masquerade, snat
	Random      bool
	FullyRandom bool
	Text        string
}

func (f *ruleFacts) merge(o ruleFacts) {
	f.LB = append(f.LB, o.LB...)
	f.NAT = append(f.NAT, o.NAT...)
	f.Notrack = append(f.Notrack, o.Notrack...)
	f.RuleSeen += o.RuleSeen
}

const nodeLocalIP = "169.254.20.10"

func argAfter(words []string, flag string) string {
	for i := 0; i+1 < len(words); i++ {
		if words[i] == flag {
			return words[i+1]
		}
	}
	return ""
}

// parseIptablesSave reads iptables-save output (several dumps may be
// concatenated). Malformed lines are skipped; iptables-save output is
// machine-written, so the parser only needs to be robust, not strict.
func parseIptablesSave(source, text string) ruleFacts {
	type rule struct{ words []string }
	var f ruleFacts
	chains := map[string][]rule{} // "table/chain"
	var order []string
	for _, r := range natrules.SplitSave(text) {
		key := r.Table + "/" + r.Chain
		if _, ok := chains[key]; !ok {
			order = append(order, key)
		}
		chains[key] = append(chains[key], rule{r.Words})
		f.RuleSeen++
	}
	// Who jumps to each chain, to learn a service chain's VIP and port.
	refs := map[string][]rule{}
	for _, key := range order {
		tbl, _, _ := strings.Cut(key, "/")
		for _, r := range chains[key] {
			if t := argAfter(r.words, "-j"); t != "" {
				refs[tbl+"/"+t] = append(refs[tbl+"/"+t], r)
			}
		}
	}
	for _, key := range order {
		tbl, chain, _ := strings.Cut(key, "/")
		rules := chains[key]
		random := false
		endpoints := 0
		dns := strings.Contains(strings.ToLower(chain), "dns")
		var desc []string
		for _, r := range rules {
			w := r.words
			if slices.Contains(w, "statistic") && argAfter(w, "--mode") == "random" {
				random = true
			}
			switch t := argAfter(w, "-j"); {
			case t == "" || t == "KUBE-MARK-MASQ" || t == "RETURN" || t == "ACCEPT" || t == "MARK" || t == "DROP" || t == "REJECT":
			default:
				if strings.HasPrefix(t, "KUBE-SEP-") || t == "DNAT" {
					endpoints++
				}
			}
			if c := argAfter(w, "--comment"); strings.Contains(c, "kube-dns") {
				dns = true
			}
			if argAfter(w, "--dport") == "53" {
				dns = true
			}
			switch t := argAfter(w, "-j"); t {
			case "MASQUERADE", "SNAT":
				f.NAT = append(f.NAT, natRule{Source: source, Where: key, Kind: t,
					Random: slices.Contains(w, "--random"), FullyRandom: slices.Contains(w, "--random-fully"), Text: strings.Join(w, " ")})
			case "NOTRACK", "CT":
				if (t == "NOTRACK" || slices.Contains(w, "--notrack")) && strings.Contains(strings.Join(w, " "), nodeLocalIP) {
					f.Notrack = append(f.Notrack, source+": "+strings.Join(w, " "))
				}
			}
		}
		for _, r := range refs[key] {
			if argAfter(r.words, "--dport") == "53" {
				dns = true
			}
			if d := argAfter(r.words, "-d"); d != "" {
				desc = append(desc, d)
			}
			if c := argAfter(r.words, "--comment"); c != "" {
				if strings.Contains(c, "kube-dns") {
					dns = true
				}
				desc = append(desc, strconv.Quote(c))
			}
		}
		if random && tbl == "nat" {
			f.LB = append(f.LB, lbChain{Source: source, Chain: chain, Endpoints: endpoints, DNS: dns, Desc: strings.Join(dedupe(desc), " ")})
		}
	}
	return f
}

var (
	reNumgen    = regexp.MustCompile(`numgen random mod (\d+)`)
	reNftTable  = regexp.MustCompile(`^table (\S+) (\S+) \{`)
	reNftChain  = regexp.MustCompile(`^chain (\S+) \{`)
	reNftTarget = regexp.MustCompile(`(?:goto|jump) (\S+)`)
	reNftRandom = regexp.MustCompile(`\brandom\b`)
)

// parseNftText reads `nft list ruleset` output: tables, chains and rules,
// one rule per line (anonymous sets spanning lines are joined).
func parseNftText(source, text string) ruleFacts {
	var f ruleFacts
	table, chain := "", ""
	depth := 0
	pending := ""
	type nrule struct{ table, chain, text string }
	var rules []nrule
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if pending != "" {
			pending += " " + line
			if strings.Count(pending, "{") > strings.Count(pending, "}") {
				continue
			}
			rules = append(rules, nrule{table, chain, pending})
			pending = ""
			continue
		}
		switch {
		case depth == 0:
			if m := reNftTable.FindStringSubmatch(line); m != nil {
				table = m[1] + " " + m[2]
				depth = 1
			}
		case depth == 1:
			if m := reNftChain.FindStringSubmatch(line); m != nil {
				chain = m[1]
				depth = 2
			} else if line == "}" {
				depth = 0
			} else if strings.HasSuffix(line, "{") {
				depth = 3 // a set, map or flowtable block
			}
		case depth == 3:
			if strings.HasSuffix(line, "{") {
				depth = 4
			} else if line == "}" {
				depth = 1
			}
		case depth == 4:
			if line == "}" || strings.HasSuffix(line, "}") && strings.Count(line, "{") < strings.Count(line, "}") {
				depth = 3
			}
		case depth == 2:
			if line == "}" {
				depth = 1
				continue
			}
			if strings.HasPrefix(line, "type ") || strings.HasPrefix(line, "policy ") {
				continue
			}
			if strings.Count(line, "{") > strings.Count(line, "}") {
				pending = line
				continue
			}
			rules = append(rules, nrule{table, chain, line})
		}
	}
	for _, r := range rules {
		f.RuleSeen++
		where := r.table + "/" + r.chain
		if m := reNumgen.FindStringSubmatch(r.text); m != nil {
			n, _ := strconv.Atoi(m[1])
			dns := strings.Contains(r.chain, "dns") || strings.Contains(r.text, "dport 53")
			f.LB = append(f.LB, lbChain{Source: source, Chain: where, Endpoints: n, DNS: dns})
		}
		words := strings.Fields(r.text)
		for i, w := range words {
			if w == "masquerade" || (w == "snat" && i+1 < len(words) && (words[i+1] == "to" || words[i+1] == "ip" || words[i+1] == "ip6")) {
				rest := strings.Join(words[i:], " ")
				f.NAT = append(f.NAT, natRule{Source: source, Where: where, Kind: w,
					FullyRandom: strings.Contains(rest, "fully-random"),
					Random:      reNftRandom.MatchString(strings.ReplaceAll(rest, "fully-random", "")),
					Text:        r.text})
				break
			}
		}
		if strings.Contains(r.text, "notrack") && strings.Contains(r.text, nodeLocalIP) {
			f.Notrack = append(f.Notrack, source+": "+where+": "+r.text)
		}
	}
	// A chain reached from a "dport 53" rule is a DNS service chain.
	for _, r := range rules {
		if !strings.Contains(r.text, "dport 53") {
			continue
		}
		for _, m := range reNftTarget.FindAllStringSubmatch(r.text, -1) {
			for i := range f.LB {
				if f.LB[i].Chain == r.table+"/"+m[1] {
					f.LB[i].DNS = true
				}
			}
		}
	}
	return f
}

func dedupe(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
