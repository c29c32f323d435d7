package natrules

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The expressions below are the ones `nft --debug=netlink` shows nft
// 1.0.6 writing for the rules in the comments: what kube-proxy (through
// knftables, which runs nft) and the lab install.

func verdictVal(t *testing.T, k expr.VerdictKind, chain string) []byte {
	t.Helper()
	attrs := []netlink.Attribute{{Type: unix.NFTA_VERDICT_CODE, Data: binary.BigEndian.AppendUint32(nil, uint32(int32(k)))}}
	if chain != "" {
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_VERDICT_CHAIN, Data: []byte(chain + "\x00")})
	}
	b, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ip4(s string) []byte  { a := netip.MustParseAddr(s).As4(); return a[:] }
func be16(p uint16) []byte { return binary.BigEndian.AppendUint16(nil, p) }

// daddrProtoPort is "ip daddr A meta l4proto P th dport N" as single
// comparisons.
func daddrProtoPort(addr string, proto byte, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ip4(addr)},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(port)},
	}
}

// dnatTo is "dnat to ADDR:PORT" (meta l4proto udp first, as kube-proxy
// writes it).
func dnatTo(addr string, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Immediate{Register: 1, Data: ip4(addr)},
		&expr.Immediate{Register: 2, Data: be16(port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

func jumpTo(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

// offline walks chains given as expression lists, with sets given by
// name, as readNft does with what it reads over netlink.
func offline(t *testing.T, family nftables.TableFamily, entries []string, chains map[string][][]expr.Any, sets map[string]*nftables.Set, elems map[string][]nftables.SetElement) *Table {
	t.Helper()
	tbl := &nftables.Table{Name: "test", Family: family}
	r := &nftTableReader{family: family, source: "nftables " + FamilyName(family) + " test", table: tbl, sets: sets, elems: elems}
	if r.sets == nil {
		r.sets = map[string]*nftables.Set{}
	}
	tb := r.walk(entries, func(name string) ([][]expr.Any, error) {
		c, ok := chains[name]
		if !ok {
			return nil, fmt.Errorf("no such chain")
		}
		return c, nil
	})
	for _, s := range tb.Services() {
		t.Logf("%s -> %v", s.Key(), s.Backends)
	}
	for _, n := range tb.Notes {
		t.Logf("note: %s", n)
	}
	return tb
}

// kube-proxy's nftables mode: "ip daddr . meta l4proto . th dport vmap
// @service-ips", service chains with "numgen random mod N vmap { ... }",
// endpoint chains with "dnat to", and the NodePort map that only matches
// local addresses.
func TestKubeProxyNftShape(t *testing.T) {
	svcKey := func(addr string, proto byte, port uint16) []byte {
		k := append(ip4(addr), proto, 0, 0, 0)
		return append(k, be16(port)[0], be16(port)[1], 0, 0)
	}
	ng := func(i uint32) []byte { return binary.NativeEndian.AppendUint32(nil, i) }
	sets := map[string]*nftables.Set{
		"service-ips":       {Name: "service-ips", IsMap: true, Concatenation: true},
		"service-nodeports": {Name: "service-nodeports", IsMap: true, Concatenation: true},
		"__map0":            {Name: "__map0", IsMap: true, Anonymous: true, Constant: true},
		"__map1":            {Name: "__map1", IsMap: true, Anonymous: true, Constant: true},
	}
	elems := map[string][]nftables.SetElement{
		"service-ips": {
			{Key: svcKey("10.96.0.10", unix.IPPROTO_UDP, 53), Val: verdictVal(t, expr.VerdictGoto, "service-DNS")},
			{Key: svcKey("10.96.0.1", unix.IPPROTO_TCP, 443), Val: verdictVal(t, expr.VerdictGoto, "service-API")},
		},
		"service-nodeports": {
			{Key: append([]byte{unix.IPPROTO_UDP, 0, 0, 0}, be16(30053)...), Val: verdictVal(t, expr.VerdictGoto, "external-DNS")},
		},
		"__map0": {
			{Key: ng(0), Val: verdictVal(t, expr.VerdictGoto, "endpoint-A")},
			{Key: ng(1), Val: verdictVal(t, expr.VerdictGoto, "endpoint-B")},
		},
		"__map1": {
			{Key: ng(0), Val: verdictVal(t, expr.VerdictGoto, "endpoint-API")},
		},
	}
	svcMap := func(set string) []expr.Any {
		return []expr.Any{
			&expr.Numgen{Register: 1, Modulus: uint32(len(elems[set])), Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: 1, SetName: set, DestRegister: 0, IsDestRegSet: true},
		}
	}
	masq := []expr.Any{ // ip saddr 10.244.1.5 jump mark-for-masquerade
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ip4("10.244.1.5")},
		jumpTo("mark-for-masquerade"),
	}
	chains := map[string][][]expr.Any{
		"nat-prerouting": {{jumpTo("services")}},
		"nat-output":     {{jumpTo("services")}},
		"services": {
			{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9},
				&expr.Payload{DestRegister: 10, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Lookup{SourceRegister: 1, SetName: "service-ips", IsDestRegSet: true},
			},
			{ // fib daddr type local meta l4proto . th dport vmap @service-nodeports
				&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL)},
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Lookup{SourceRegister: 1, SetName: "service-nodeports", IsDestRegSet: true},
			},
		},
		"mark-for-masquerade": {{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{0xff, 0xbf, 0xff, 0xff}, Xor: []byte{0, 0x40, 0, 0}},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		}},
		"service-DNS": {
			append(daddrProtoPort("10.96.0.10", unix.IPPROTO_UDP, 53),
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 2},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{10, 244}},
				jumpTo("mark-for-masquerade")),
			svcMap("__map0"),
		},
		"external-DNS": {{jumpTo("mark-for-masquerade")}, {&expr.Verdict{Kind: expr.VerdictGoto, Chain: "service-DNS"}}},
		"service-API":  {svcMap("__map1")},
		"endpoint-A":   {masq, dnatTo("10.244.1.5", 53)},
		"endpoint-B":   {masq, dnatTo("10.244.2.7", 53)},
		"endpoint-API": {dnatTo("192.168.0.100", 6443)},
	}
	tb := offline(t, nftables.TableFamilyIPv4, []string{"nat-prerouting", "nat-output"}, chains, sets, elems)
	wantBackends(t, tb, "10.96.0.10:53", unix.IPPROTO_UDP, "10.244.1.5:53", "10.244.2.7:53")
	// endpoint-API's dnat matches udp only (as dnatTo writes it): a tcp
	// packet never reaches it.
	wantBackends(t, tb, "10.96.0.1:443", unix.IPPROTO_TCP)
	if len(tb.Services()) != 1 || len(tb.Notes) != 0 {
		t.Errorf("services %+v notes %q", tb.Services(), tb.Notes)
	}
	if _, src, _ := tb.Backends(netip.MustParseAddrPort("10.96.0.10:53"), unix.IPPROTO_UDP); src != "nftables ip test" {
		t.Errorf("source %q", src)
	}
}

// The lab's shape (internal/lab addNAT): one rule per backend in the
// prerouting chain, each matching the VIP, the first K-1 also "numgen
// random mod (K-i) == 0".
func TestLabNftShape(t *testing.T) {
	rule := func(i, k int, backend string) []expr.Any {
		ex := daddrProtoPort("10.96.0.10", unix.IPPROTO_UDP, 53)
		if left := k - i; left > 1 {
			ex = append(ex,
				&expr.Numgen{Register: 1, Modulus: uint32(left), Type: unix.NFT_NG_RANDOM},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, 0)})
		}
		return append(ex,
			&expr.Immediate{Register: 1, Data: ip4(backend)},
			&expr.Immediate{Register: 2, Data: be16(5353)},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true})
	}
	chains := map[string][][]expr.Any{"prerouting": {
		rule(0, 3, "10.99.0.1"), rule(1, 3, "10.99.0.2"), rule(2, 3, "10.99.0.3"),
		rule(0, 1, "10.99.0.4"), // shadowed: the rule before it takes every packet left
	}}
	tb := offline(t, nftables.TableFamilyIPv4, []string{"prerouting"}, chains, nil, nil)
	wantBackends(t, tb, "10.96.0.10:53", unix.IPPROTO_UDP, "10.99.0.1:5353", "10.99.0.2:5353", "10.99.0.3:5353")
}

// inet tables: "meta nfproto" guards, IPv6 addresses, a bitwise prefix (no
// VIP), "!=", port ranges, a set of addresses, and a dnat from a map (not
// understood: a note).
func TestInetNftShapes(t *testing.T) {
	vip6 := netip.MustParseAddr("fd00:10:96::a").As16()
	be6 := netip.MustParseAddr("fd00:10:244:1::5").As16()
	nfproto := func(p byte) []expr.Any {
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
	}
	sets := map[string]*nftables.Set{"__set0": {Name: "__set0", Anonymous: true}, "__map0": {Name: "__map0", IsMap: true, Anonymous: true}}
	elems := map[string][]nftables.SetElement{
		"__set0": {{Key: ip4("10.96.0.20")}, {Key: ip4("10.96.0.21")}},
		"__map0": {{Key: ip4("10.96.0.30"), Val: ip4("10.244.0.30")}},
	}
	chains := map[string][][]expr.Any{"dstnat": {
		// meta nfproto ipv6 ip6 daddr VIP udp dport 53 dnat ip6 to [BE]:53
		append(append(nfproto(unix.NFPROTO_IPV6),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: vip6[:]},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(53)},
			&expr.Immediate{Register: 1, Data: be6[:]},
			&expr.Immediate{Register: 2, Data: be16(53)}),
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV6, RegAddrMin: 1, RegProtoMin: 2, Specified: true}),
		// meta nfproto ipv4 ip daddr 10.96.0.0/12 dnat ip to 10.244.0.1 (no VIP)
		append(nfproto(unix.NFPROTO_IPV4),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 240, 0, 0}, Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ip4("10.96.0.0")},
			&expr.Immediate{Register: 1, Data: ip4("10.244.0.1")},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1}),
		// ip daddr { 10.96.0.20, 10.96.0.21 } udp dport 5300-5400 dnat ip to 10.244.0.20
		{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: "__set0"},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: be16(5300), ToData: be16(5400)},
			&expr.Immediate{Register: 1, Data: ip4("10.244.0.20")},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
		},
		// ip daddr != 10.96.0.40 ip daddr 10.96.0.40 dnat ip to 10.244.0.40 (never)
		{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ip4("10.96.0.40")},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ip4("10.96.0.40")},
			&expr.Immediate{Register: 1, Data: ip4("10.244.0.40")},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
		},
		// ip daddr 10.96.0.30 dnat ip to ip daddr map { 10.96.0.30 : 10.244.0.30 }
		{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ip4("10.96.0.30")},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: "__map0", DestRegister: 1, IsDestRegSet: true},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
		},
	}}
	tb := offline(t, nftables.TableFamilyINet, []string{"dstnat"}, chains, sets, elems)
	wantBackends(t, tb, "[fd00:10:96::a]:53", unix.IPPROTO_UDP, "[fd00:10:244:1::5]:53")
	wantBackends(t, tb, "10.96.0.20:5353", unix.IPPROTO_UDP, "10.244.0.20:5353")
	wantBackends(t, tb, "10.96.0.21:5300", unix.IPPROTO_TCP, "10.244.0.20:5300")
	wantBackends(t, tb, "10.96.0.40:53", unix.IPPROTO_UDP)
	wantBackends(t, tb, "10.96.0.30:53", unix.IPPROTO_UDP)
	if len(tb.Services()) != 3 {
		t.Errorf("%d services, want 3", len(tb.Services()))
	}
	if len(tb.Notes) != 1 {
		t.Errorf("notes %q, want one for the dnat from a map", tb.Notes)
	}
}
