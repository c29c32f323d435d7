package natrules

import (
	"fmt"
	"net/netip"
)

// Both front ends (iptables-save text, nftables over netlink) turn a
// chain's rules into the same small form, and one walker follows it: a
// rule is a list of paths (more than one when a set or verdict map splits
// it), a path is a conjunction of conditions on the three fields a service
// is keyed by (destination address, layer 4 protocol, destination port)
// plus one action.

// pkt is what the walk knows about the packets on a path: the zero value
// of a field means "any".
type pkt struct {
	addr  netip.Addr
	proto uint8
	port  uint16
	// notAddr is one address the packets are known not to go to (an
	// earlier "! -d ADDR"), while addr is unknown.
	notAddr netip.Addr
}

type condKind uint8

const (
	condMaybe    condKind = iota // a condition the walker cannot decide (source, mark, statistic, ...)
	condAddr                     // destination in prefix
	condProto                    // layer 4 protocol
	condPort                     // destination port in [port, portHi]
	condFamily                   // IPv6 when v6, else IPv4 (meta nfproto)
	condNotAddr                  // the negations
	condNotProto                 //
	condNotPort                  //
)

type cond struct {
	kind   condKind
	prefix netip.Prefix
	proto  uint8
	port   uint16
	portHi uint16
	v6     bool
}

func addrCond(a netip.Addr) cond {
	return cond{kind: condAddr, prefix: netip.PrefixFrom(a, a.BitLen())}
}
func protoCond(p uint8) cond { return cond{kind: condProto, proto: p} }
func portCond(p uint16) cond { return cond{kind: condPort, port: p, portHi: p} }
func maybeCond() cond        { return cond{kind: condMaybe} }

// not returns the negation of c; the negation of what the walker cannot
// decide stays undecidable.
func (c cond) not() cond {
	switch c.kind {
	case condAddr:
		c.kind = condNotAddr
	case condProto:
		c.kind = condNotProto
	case condPort:
		c.kind = condNotPort
	case condNotAddr:
		c.kind = condAddr
	case condNotProto:
		c.kind = condProto
	case condNotPort:
		c.kind = condPort
	case condFamily:
		c.v6 = !c.v6
	}
	return c
}

type tri uint8

const (
	no tri = iota
	yes
	maybe
)

// narrow applies c's exact constraints to p. It reports false when c
// excludes every packet of p.
func (c cond) narrow(p pkt) (pkt, bool) {
	switch c.kind {
	case condAddr:
		if !c.prefix.IsSingleIP() {
			return p, true
		}
		if p.addr.IsValid() {
			return p, p.addr == c.prefix.Addr()
		}
		if p.notAddr == c.prefix.Addr() {
			return p, false
		}
		p.addr, p.notAddr = c.prefix.Addr(), netip.Addr{}
	case condNotAddr:
		if c.prefix.IsSingleIP() && !p.addr.IsValid() && !p.notAddr.IsValid() {
			p.notAddr = c.prefix.Addr()
		}
	case condProto:
		if p.proto != 0 {
			return p, p.proto == c.proto
		}
		p.proto = c.proto
	case condPort:
		if c.port != c.portHi {
			return p, true
		}
		if p.port != 0 {
			return p, p.port == c.port
		}
		p.port = c.port
	}
	return p, true
}

// eval decides c for the packets of p.
func (c cond) eval(p pkt) tri {
	switch c.kind {
	case condAddr, condNotAddr:
		if !p.addr.IsValid() {
			if c.prefix.IsSingleIP() && p.notAddr == c.prefix.Addr() {
				return boolTri(c.kind == condNotAddr)
			}
			return maybe
		}
		in := c.prefix.Contains(p.addr)
		return boolTri(in == (c.kind == condAddr))
	case condProto, condNotProto:
		if p.proto == 0 {
			return maybe
		}
		return boolTri((p.proto == c.proto) == (c.kind == condProto))
	case condPort, condNotPort:
		if p.port == 0 {
			return maybe
		}
		in := p.port >= c.port && p.port <= c.portHi
		return boolTri(in == (c.kind == condPort))
	case condFamily:
		if !p.addr.IsValid() {
			return maybe
		}
		return boolTri(p.addr.Is6() == c.v6)
	}
	return maybe
}

func boolTri(b bool) tri {
	if b {
		return yes
	}
	return no
}

type actKind uint8

const (
	actNone   actKind = iota // the rule only matches, counts or marks: the chain goes on
	actJump                  // jump: the chain goes on when the target returns
	actGoto                  // goto: the chain ends, the caller goes on when the target returns
	actStop                  // accept, drop, reject, queue: the packet leaves the NAT hook
	actReturn                // return to the caller
	actDNAT                  // destination NAT (ends the hook, like accept)
)

type action struct {
	kind  actKind
	chain string
	// to is the DNAT target; port 0 keeps the packet's destination port.
	to netip.AddrPort
}

// path is one way through a rule. hidden paths differ only by a value the
// walker cannot see (numgen random, a hash): each is taken for some
// packets of any kind.
type path struct {
	conds  []cond
	act    action
	hidden bool
}

type rule struct {
	paths []path
	// hiddenTotal: the hidden paths together take every packet (a
	// numgen random mod N map with all N keys).
	hiddenTotal bool
}

type chain struct {
	name  string
	rules []rule
}

// ruleset is one front end's rules: the chains of one source (an
// iptables-save table, an nftables table) and the chains a packet enters
// at the NAT hooks that DNAT happens in (prerouting, output).
type ruleset struct {
	source  string
	chains  map[string]*chain
	entries []string
	// load, when set, fills a chain on first use (nftables reads a
	// chain's rules over netlink only when the walk reaches it).
	load func(name string) (*chain, error)
}

// maxDepth bounds nested jumps. The kernel refuses loops and limits
// nftables to 16 nested jumps; iptables has no limit but no real ruleset
// nests deeper than a handful.
const maxDepth = 64

// walker follows a ruleset from its entry chains and reports every DNAT
// it can reach with the packet fields known at that point.
type walker struct {
	rs    *ruleset
	memo  map[walkKey]bool
	found func(p pkt, to netip.AddrPort)
	notes []string
}

type walkKey struct {
	chain string
	from  int
	p     pkt
}

func (w *walker) note(format string, args ...any) {
	if len(w.notes) < maxNotes {
		w.notes = append(w.notes, fmt.Sprintf(format, args...))
	}
}

func (w *walker) run() {
	w.memo = map[walkKey]bool{}
	for _, name := range w.rs.entries {
		w.walk(name, 0, pkt{}, 0)
	}
}

func (w *walker) chain(name string) *chain {
	if c, ok := w.rs.chains[name]; ok {
		return c
	}
	var c *chain
	if w.rs.load != nil {
		var err error
		if c, err = w.rs.load(name); err != nil {
			w.note("%s: chain %s: %v", w.rs.source, name, err)
		}
	} else {
		w.note("%s: jump to chain %s, which does not exist", w.rs.source, name)
	}
	w.rs.chains[name] = c
	return c
}

// walk follows chain name from rule index from for the packets p, records
// the DNATs it reaches, and reports whether every one of those packets
// ends in a verdict inside (so a caller's jump does not come back).
// Answers are memoised: records are a set, so walking a state twice adds
// nothing.
func (w *walker) walk(name string, from int, p pkt, depth int) bool {
	key := walkKey{name, from, p}
	if v, ok := w.memo[key]; ok {
		return v
	}
	if depth > maxDepth {
		w.note("%s: jumps nested deeper than %d at chain %s", w.rs.source, maxDepth, name)
		return false
	}
	w.memo[key] = false // a loop (the kernel forbids them) ends here
	v := w.walkRules(name, from, p, depth)
	w.memo[key] = v
	return v
}

func (w *walker) walkRules(name string, from int, p pkt, depth int) bool {
	c := w.chain(name)
	if c == nil {
		return false
	}
	// done holds the narrower kinds of packets an earlier rule surely
	// ended: a later rule does not see them.
	done := map[pkt]bool{}
	for i := from; i < len(c.rules); i++ {
		r := c.rules[i]
		allHiddenStop, hiddenEnds, anyHidden := true, true, false
		for _, pa := range r.paths {
			q, certain, ok := match(pa.conds, p)
			if !ok || (q != p && endedBefore(done, q)) {
				if pa.hidden {
					allHiddenStop = false
				}
				continue
			}
			stop, ends := w.act(pa.act, q, depth)
			covering := certain && q == p
			if pa.hidden {
				anyHidden = true
				if !(covering && stop) {
					allHiddenStop = false
				}
				hiddenEnds = hiddenEnds && ends
				continue
			}
			if covering && stop {
				return ends
			}
			switch {
			case q == p:
			case certain && stop:
				done[q] = true
			default:
				// Packets of the narrower kind that this rule lets
				// through go on down the chain with what it learnt.
				w.walk(name, i+1, q, depth)
			}
		}
		if anyHidden && r.hiddenTotal && allHiddenStop {
			return hiddenEnds
		}
	}
	return false
}

// endedBefore reports whether q, or a wider kind of packets that holds q,
// is in done.
func endedBefore(done map[pkt]bool, q pkt) bool {
	if len(done) == 0 {
		return false
	}
	for m := 0; m < 16; m++ {
		d := q
		if m&1 != 0 {
			d.addr = netip.Addr{}
		}
		if m&2 != 0 {
			d.proto = 0
		}
		if m&4 != 0 {
			d.port = 0
		}
		if m&8 != 0 {
			d.notAddr = netip.Addr{}
		}
		if done[d] {
			return true
		}
	}
	return false
}

// act performs a path's action for packets q. stop: the chain does not go
// on after it; ends: the packets end in a verdict (for the caller's jump).
func (w *walker) act(a action, q pkt, depth int) (stop, ends bool) {
	switch a.kind {
	case actDNAT:
		w.found(q, a.to)
		return true, true
	case actStop:
		return true, true
	case actReturn:
		return true, false
	case actJump:
		e := w.walk(a.chain, 0, q, depth+1)
		return e, e
	case actGoto:
		return true, w.walk(a.chain, 0, q, depth+1)
	}
	return false, false
}

// match narrows p by the exact conditions of conds, then decides the rest.
// ok is false when some condition excludes every packet; certain is false
// when some condition may or may not hold.
func match(conds []cond, p pkt) (q pkt, certain, ok bool) {
	q = p
	for _, c := range conds {
		if q, ok = c.narrow(q); !ok {
			return q, false, false
		}
	}
	certain = true
	for _, c := range conds {
		switch c.eval(q) {
		case no:
			return q, false, false
		case maybe:
			certain = false
		}
	}
	return q, certain, true
}
