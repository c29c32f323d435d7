package natrules

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// FamilyName returns nft's name of a table family ("ip", "inet", ...).
func FamilyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprintf("family%d", f)
}

// maxPaths bounds how far set lookups split one rule. kube-proxy's
// service-ips map has one element per service port, so this is far above
// any cluster's; past it the lookup counts as a condition not understood.
const maxPaths = 1 << 17

// readNft reads the nftables rules of the namespace at netnsPath ("" = the
// caller's) over netlink and walks every NAT chain on the prerouting and
// output hooks.
func readNft(netnsPath string) (*Table, error) {
	var opts []nftables.ConnOption
	if netnsPath != "" {
		f, err := os.Open(netnsPath)
		if err != nil {
			return nil, fmt.Errorf("opening network namespace: %w", err)
		}
		defer f.Close()
		opts = append(opts, nftables.WithNetNSFd(int(f.Fd())))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("opening nftables netlink: %w", err)
	}
	defer c.CloseLasting()
	chains, err := c.ListChains()
	if err != nil {
		return nil, fmt.Errorf("listing nftables chains: %w", err)
	}
	type tableKey struct {
		family nftables.TableFamily
		name   string
	}
	byTable := map[tableKey][]*nftables.Chain{}
	var order []tableKey
	for _, ch := range chains {
		k := tableKey{ch.Table.Family, ch.Table.Name}
		if _, ok := byTable[k]; !ok {
			order = append(order, k)
		}
		byTable[k] = append(byTable[k], ch)
	}
	t := newTable()
	natChains := 0
	for _, k := range order {
		switch k.family {
		case nftables.TableFamilyIPv4, nftables.TableFamilyIPv6, nftables.TableFamilyINet:
		default:
			continue
		}
		tr := &nftTableReader{conn: c, family: k.family, chains: byTable[k],
			source: "nftables " + FamilyName(k.family) + " " + k.name}
		tt, n, err := tr.read()
		if err != nil {
			t.Notes = append(t.Notes, fmt.Sprintf("%s: %v", tr.source, err))
			continue
		}
		natChains += n
		t.merge(tt)
	}
	t.Sources = append(t.Sources, fmt.Sprintf("nftables (netlink): %d tables, %d NAT chains on prerouting/output", len(order), natChains))
	return t, nil
}

// nftTableReader walks one nftables table.
type nftTableReader struct {
	conn   *nftables.Conn
	family nftables.TableFamily
	chains []*nftables.Chain
	source string

	table  *nftables.Table
	sets   map[string]*nftables.Set
	elems  map[string][]nftables.SetElement
	w      *walker
	compat int // rules with iptables-nft's xt expressions
}

func (r *nftTableReader) read() (*Table, int, error) {
	known := map[string]bool{}
	var entries []string
	for _, ch := range r.chains {
		r.table = ch.Table
		known[ch.Name] = true
		if ch.Type == nftables.ChainTypeNAT && ch.Hooknum != nil &&
			(*ch.Hooknum == *nftables.ChainHookPrerouting || *ch.Hooknum == *nftables.ChainHookOutput) {
			entries = append(entries, ch.Name)
		}
	}
	if len(entries) == 0 {
		return newTable(), 0, nil
	}
	t := r.walk(entries, func(name string) ([][]expr.Any, error) {
		if !known[name] {
			return nil, fmt.Errorf("no such chain")
		}
		rules, err := r.conn.GetRules(r.table, &nftables.Chain{Name: name, Table: r.table})
		if err != nil {
			return nil, fmt.Errorf("listing rules: %w", err)
		}
		out := make([][]expr.Any, len(rules))
		for i, ru := range rules {
			out[i] = ru.Exprs
		}
		return out, nil
	})
	return t, len(entries), nil
}

// walk follows the table from its NAT entry chains; rules returns a
// chain's rules, read when the walk first reaches the chain.
func (r *nftTableReader) walk(entries []string, rules func(chain string) ([][]expr.Any, error)) *Table {
	t := newTable()
	rs := &ruleset{source: r.source, chains: map[string]*chain{}, entries: entries}
	r.w = &walker{rs: rs}
	rs.load = func(name string) (*chain, error) {
		exprs, err := rules(name)
		if err != nil {
			return nil, err
		}
		c := &chain{name: name}
		for _, ex := range exprs {
			c.rules = append(c.rules, r.rule(name, ex))
		}
		return c, nil
	}
	r.w.found = func(p pkt, to netip.AddrPort) { t.add(r.source, p, to) }
	r.w.run()
	t.Notes = append(t.Notes, r.w.notes...)
	if r.compat > 0 {
		t.Notes = append(t.Notes, fmt.Sprintf("%s: %d rules written by iptables-nft: read through iptables-nft-save", r.source, r.compat))
	}
	return t
}

func (r *nftTableReader) set(name string) (*nftables.Set, []nftables.SetElement, error) {
	if r.sets == nil {
		sets, err := r.conn.GetSets(r.table)
		if err != nil {
			return nil, nil, fmt.Errorf("listing sets: %w", err)
		}
		r.sets = map[string]*nftables.Set{}
		r.elems = map[string][]nftables.SetElement{}
		for _, s := range sets {
			s.Table = r.table
			r.sets[s.Name] = s
		}
	}
	s := r.sets[name]
	if s == nil {
		return nil, nil, fmt.Errorf("no set %s", name)
	}
	if e, ok := r.elems[name]; ok {
		return s, e, nil
	}
	e, err := r.conn.GetSetElements(s)
	if err != nil {
		return nil, nil, fmt.Errorf("listing elements of set %s: %w", name, err)
	}
	r.elems[name] = e
	return s, e, nil
}

// What a register holds, as far as the walk cares.
type fieldKind uint8

const (
	fOther      fieldKind = iota
	fAddr                 // destination address
	fAddrPrefix           // the first bits of the destination address
	fProto                // meta l4proto
	fPort                 // transport destination port
	fNfproto              // meta nfproto
	fHidden               // numgen, hash: a value the walk cannot see
	fImm                  // an immediate value
)

type regVal struct {
	kind fieldKind
	n    int // bytes
	bits int // fAddrPrefix
	v6   bool
	mod  uint32 // fHidden
	data []byte // fImm
}

// regs maps 32-bit register indexes (NFT_REG32_00 = 8) to their contents.
// The 128-bit registers NFT_REG_1..4 alias four 32-bit ones each.
type regs map[uint32]regVal

func regIndex(r uint32) uint32 {
	if r >= 1 && r <= 4 {
		return 8 + (r-1)*4
	}
	return r
}

func width(n int) uint32 { return uint32(max(1, (n+3)/4)) }

func (rg regs) set(r uint32, v regVal) {
	i, w := regIndex(r), width(v.n)
	for j, x := range rg {
		if j < i+w && i < j+width(x.n) {
			delete(rg, j)
		}
	}
	rg[i] = v
}

func (rg regs) get(r uint32) (regVal, bool) {
	v, ok := rg[regIndex(r)]
	return v, ok
}

// rule turns one nftables rule's expressions into paths. Registers are
// followed from the loads to the comparisons, lookups and the NAT that
// read them.
func (r *nftTableReader) rule(chainName string, exprs []expr.Any) rule {
	v4 := r.family != nftables.TableFamilyIPv6
	v6 := r.family != nftables.TableFamilyIPv4
	rg := regs{}
	paths := []path{{}}
	out := rule{}
	hasAct := false
	addCond := func(c cond) {
		for i := range paths {
			paths[i].conds = append(paths[i].conds, c)
		}
	}
	setAct := func(a action) {
		for i := range paths {
			if paths[i].act.kind == actNone {
				paths[i].act = a
			}
		}
		hasAct = true
	}
	where := r.source + "/" + chainName
	compat := false
	defer func() {
		if compat {
			r.compat++
		}
	}()
	for _, e := range exprs {
		if hasAct {
			break // a verdict ends the rule
		}
		switch x := e.(type) {
		case *expr.Payload:
			if x.OperationType == expr.PayloadWrite {
				continue
			}
			v := regVal{kind: fOther, n: int(x.Len)}
			switch {
			case x.Base == expr.PayloadBaseNetworkHeader && v4 && x.Offset == 16 && x.Len == 4:
				v = regVal{kind: fAddr, n: 4}
			case x.Base == expr.PayloadBaseNetworkHeader && v4 && x.Offset == 16 && x.Len < 4:
				v = regVal{kind: fAddrPrefix, n: int(x.Len), bits: 8 * int(x.Len)}
			case x.Base == expr.PayloadBaseNetworkHeader && v6 && x.Offset == 24 && x.Len == 16:
				v = regVal{kind: fAddr, n: 16, v6: true}
			case x.Base == expr.PayloadBaseNetworkHeader && v6 && x.Offset == 24 && x.Len < 16:
				v = regVal{kind: fAddrPrefix, n: int(x.Len), bits: 8 * int(x.Len), v6: true}
			case x.Base == expr.PayloadBaseTransportHeader && x.Offset == 2 && x.Len == 2:
				v = regVal{kind: fPort, n: 2}
			}
			rg.set(x.DestRegister, v)
		case *expr.Meta:
			if x.SourceRegister {
				continue
			}
			switch x.Key {
			case expr.MetaKeyL4PROTO:
				rg.set(x.Register, regVal{kind: fProto, n: 1})
			case expr.MetaKeyNFPROTO:
				rg.set(x.Register, regVal{kind: fNfproto, n: 1})
			default:
				rg.set(x.Register, regVal{kind: fOther, n: 16})
			}
		case *expr.Numgen:
			rg.set(x.Register, regVal{kind: fHidden, n: 4, mod: x.Modulus})
		case *expr.Hash:
			rg.set(x.DestRegister, regVal{kind: fHidden, n: 4, mod: x.Modulus})
		case *expr.Immediate:
			rg.set(x.Register, regVal{kind: fImm, n: len(x.Data), data: x.Data})
		case *expr.Bitwise:
			src, _ := rg.get(x.SourceRegister)
			v := regVal{kind: fOther, n: int(x.Len)}
			if bits, ok := prefixMask(x.Mask, x.Xor); ok && src.kind == fAddr && int(x.Len) == src.n {
				v = regVal{kind: fAddrPrefix, n: src.n, bits: bits, v6: src.v6}
			}
			rg.set(x.DestRegister, v)
		case *expr.Ct:
			if !x.SourceRegister {
				rg.set(x.Register, regVal{kind: fOther, n: 16})
			}
		case *expr.Fib:
			rg.set(x.Register, regVal{kind: fOther, n: 16})
		case *expr.Exthdr:
			rg.set(x.DestRegister, regVal{kind: fOther, n: int(x.Len)})
		case *expr.Cmp:
			v, ok := rg.get(x.Register)
			if !ok {
				addCond(maybeCond())
				continue
			}
			addCond(cmpCond(v, x.Op, x.Data))
		case *expr.Range:
			v, ok := rg.get(x.Register)
			if !ok || v.kind != fPort || len(x.FromData) < 2 || len(x.ToData) < 2 || (x.Op != expr.CmpOpEq && x.Op != expr.CmpOpNeq) {
				addCond(maybeCond())
				continue
			}
			c := cond{kind: condPort, port: binary.BigEndian.Uint16(x.FromData), portHi: binary.BigEndian.Uint16(x.ToData)}
			if x.Op == expr.CmpOpNeq {
				c = c.not()
			}
			addCond(c)
		case *expr.Lookup:
			var done bool
			paths, done, out.hiddenTotal = r.lookup(where, x, rg, paths)
			if done {
				hasAct = true
			}
		case *expr.Verdict:
			setAct(verdictAction(x.Kind, x.Chain))
		case *expr.NAT:
			if x.Type != expr.NATTypeDestNAT {
				continue
			}
			to, ok := natTarget(x, rg)
			if !ok {
				r.w.note("%s: dnat whose address does not come from the rule itself (a map, a range): not understood", where)
				setAct(action{kind: actStop})
				continue
			}
			setAct(action{kind: actDNAT, to: to})
		case *expr.Redir:
			r.w.note("%s: redirect: its target address is not in the rules", where)
			setAct(action{kind: actStop})
		case *expr.Reject, *expr.Queue:
			setAct(action{kind: actStop})
		case *expr.Limit, *expr.Quota, *expr.Connlimit:
			addCond(maybeCond())
		case *expr.Match:
			compat = true
			addCond(maybeCond())
		case *expr.Target:
			compat = true
		case *expr.Counter, *expr.Log, *expr.Dynset, *expr.Objref, *expr.Notrack, *expr.Masq:
		default:
			// An expression this reader does not know may have written
			// any register: forget them all.
			clear(rg)
		}
	}
	for i := range paths {
		if paths[i].act.kind == actNone && out.hiddenTotal {
			// A hidden split with no verdict of its own is no split.
			out.hiddenTotal = false
		}
	}
	out.paths = paths
	return out
}

// cmpCond turns "cmp OP reg DATA" on what reg holds into a condition.
func cmpCond(v regVal, op expr.CmpOp, data []byte) cond {
	var c cond
	switch v.kind {
	case fAddr:
		a, ok := netip.AddrFromSlice(data)
		if !ok {
			return maybeCond()
		}
		c = addrCond(a)
	case fAddrPrefix:
		b := make([]byte, 4)
		if v.v6 {
			b = make([]byte, 16)
		}
		copy(b, data)
		a, _ := netip.AddrFromSlice(b)
		p, err := a.Prefix(v.bits)
		if err != nil {
			return maybeCond()
		}
		c = cond{kind: condAddr, prefix: p}
	case fProto:
		if len(data) < 1 {
			return maybeCond()
		}
		c = protoCond(data[0])
	case fPort:
		if len(data) < 2 {
			return maybeCond()
		}
		p := binary.BigEndian.Uint16(data)
		switch op {
		case expr.CmpOpLt, expr.CmpOpLte, expr.CmpOpGt, expr.CmpOpGte:
			lo, hi := uint16(1), uint16(65535)
			switch op {
			case expr.CmpOpLt:
				hi = p - 1
			case expr.CmpOpLte:
				hi = p
			case expr.CmpOpGt:
				lo = p + 1
			case expr.CmpOpGte:
				lo = p
			}
			if lo > hi || lo == 0 {
				return maybeCond()
			}
			return cond{kind: condPort, port: lo, portHi: hi}
		}
		c = portCond(p)
	case fNfproto:
		if len(data) < 1 || (data[0] != unix.NFPROTO_IPV4 && data[0] != unix.NFPROTO_IPV6) {
			return maybeCond()
		}
		c = cond{kind: condFamily, v6: data[0] == unix.NFPROTO_IPV6}
	default:
		return maybeCond()
	}
	switch op {
	case expr.CmpOpEq:
		return c
	case expr.CmpOpNeq:
		return c.not()
	}
	return maybeCond()
}

// lookup splits paths by the elements of the set a lookup reads. A verdict
// map gives each element's path its verdict (done: the rule has its
// action); a membership test keeps the rule's own. hiddenTotal reports
// that a map keyed by numgen/hash has a path for every value.
func (r *nftTableReader) lookup(where string, x *expr.Lookup, rg regs, paths []path) (out []path, done, hiddenTotal bool) {
	vmap := x.IsDestRegSet && x.DestRegister == unix.NFT_REG_VERDICT
	if x.IsDestRegSet && !vmap {
		// A data map (dnat to ip daddr map {...}): what it writes is not
		// followed.
		rg.set(x.DestRegister, regVal{kind: fOther, n: 16})
		return paths, false, false
	}
	s, elems, err := r.set(x.SetName)
	if err != nil || x.Invert {
		if err != nil {
			r.w.note("%s: lookup in %s: %v", where, x.SetName, err)
		}
		for i := range paths {
			paths[i].conds = append(paths[i].conds, maybeCond())
		}
		return paths, vmap, false // an unreadable verdict map: its verdicts are lost
	}
	// The key's fields, from the source register on: each field takes
	// whole 32-bit registers, and so whole 4-byte words of the key.
	type field struct {
		v   regVal
		off int
	}
	var fields []field
	keyLen := 0
	for _, el := range elems {
		keyLen = max(keyLen, len(el.Key))
	}
	idx := regIndex(x.SourceRegister)
	for off := 0; off < keyLen; {
		v, ok := rg[idx]
		if !ok {
			v = regVal{kind: fOther, n: 4}
		}
		fields = append(fields, field{v, off})
		off += int(width(v.n)) * 4
		idx += width(v.n)
	}
	if len(paths)*len(elems) > maxPaths {
		r.w.note("%s: set %s has %d elements: not split", where, x.SetName, len(elems))
		for i := range paths {
			paths[i].conds = append(paths[i].conds, maybeCond())
		}
		return paths, vmap, false
	}
	hiddenSeen := map[uint32]bool{}
	var mod uint32
	for _, el := range elems {
		if el.IntervalEnd {
			continue
		}
		var conds []cond
		hidden := false
		for _, f := range fields {
			if f.off+f.v.n > len(el.Key) {
				conds = append(conds, maybeCond())
				continue
			}
			b := el.Key[f.off : f.off+f.v.n]
			switch {
			case s.Interval:
				// Ranges: the element is only where one starts.
				conds = append(conds, maybeCond())
			case f.v.kind == fHidden:
				hidden, mod = true, f.v.mod
				hiddenSeen[binary.NativeEndian.Uint32(append(b[:len(b):len(b)], 0, 0, 0, 0)[:4])] = true
			case f.v.kind == fImm || f.v.kind == fOther:
				conds = append(conds, maybeCond())
			default:
				conds = append(conds, cmpCond(f.v, expr.CmpOpEq, b))
			}
		}
		var act action
		if vmap {
			act = elementAction(el)
		}
		for _, p := range paths {
			np := path{conds: append(append([]cond(nil), p.conds...), conds...), act: p.act, hidden: hidden || p.hidden}
			if vmap {
				np.act = act
			}
			out = append(out, np)
		}
	}
	hiddenTotal = mod > 0 && uint32(len(hiddenSeen)) >= mod
	return out, vmap, hiddenTotal
}

// elementAction reads a verdict map element's verdict. The library returns
// it as the raw NFTA_DATA_VERDICT attributes.
func elementAction(el nftables.SetElement) action {
	if el.VerdictData != nil {
		return verdictAction(el.VerdictData.Kind, el.VerdictData.Chain)
	}
	ad, err := netlink.NewAttributeDecoder(el.Val)
	if err != nil {
		return action{}
	}
	ad.ByteOrder = binary.BigEndian
	var kind expr.VerdictKind
	name := ""
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			kind = expr.VerdictKind(int32(ad.Uint32()))
		case unix.NFTA_VERDICT_CHAIN:
			name = strings.TrimRight(ad.String(), "\x00")
		}
	}
	if ad.Err() != nil {
		return action{}
	}
	return verdictAction(kind, name)
}

func verdictAction(k expr.VerdictKind, chainName string) action {
	switch k {
	case expr.VerdictJump:
		return action{kind: actJump, chain: chainName}
	case expr.VerdictGoto:
		return action{kind: actGoto, chain: chainName}
	case expr.VerdictReturn:
		return action{kind: actReturn}
	case expr.VerdictAccept, expr.VerdictDrop, expr.VerdictQueue, expr.VerdictStolen, expr.VerdictStop:
		return action{kind: actStop}
	}
	return action{}
}

// natTarget reads a dnat's address and port from the immediates the rule
// loaded into its registers. No address register: only the port changes.
func natTarget(x *expr.NAT, rg regs) (netip.AddrPort, bool) {
	var addr netip.Addr
	if x.RegAddrMin != 0 {
		v, ok := rg.get(x.RegAddrMin)
		if !ok || v.kind != fImm {
			return netip.AddrPort{}, false
		}
		if addr, ok = netip.AddrFromSlice(v.data); !ok {
			return netip.AddrPort{}, false
		}
		if x.RegAddrMax != 0 && x.RegAddrMax != x.RegAddrMin {
			if w, ok := rg.get(x.RegAddrMax); !ok || !slices.Equal(w.data, v.data) {
				return netip.AddrPort{}, false
			}
		}
	}
	var port uint16
	if x.RegProtoMin != 0 {
		v, ok := rg.get(x.RegProtoMin)
		if !ok || v.kind != fImm || len(v.data) < 2 {
			return netip.AddrPort{}, false
		}
		port = binary.BigEndian.Uint16(v.data)
	}
	return netip.AddrPortFrom(addr, port), true
}

// prefixMask reports the prefix length of an "& mask ^ 0" bitwise.
func prefixMask(mask, xor []byte) (int, bool) {
	for _, b := range xor {
		if b != 0 {
			return 0, false
		}
	}
	bits, ended := 0, false
	for _, b := range mask {
		for i := 7; i >= 0; i-- {
			set := b&(1<<i) != 0
			switch {
			case set && ended:
				return 0, false
			case set:
				bits++
			default:
				ended = true
			}
		}
	}
	return bits, true
}
