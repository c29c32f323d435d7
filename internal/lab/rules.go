package lab

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// TableName is the nftables table the lab adds in its namespaces.
const TableName = "dnsrace"

// QNameLen is the length of every name the lab's clients ask for
// ("svc-NN.lab.test."), so a firewall rule can find the question type at a
// fixed offset, as a real operator's AAAA filter would for one name.
const qnameWireLen = 17

// QName returns the name pod i looks up.
func QName(i int) string { return fmt.Sprintf("svc-%02d.lab.test.", i%100) }

// nftConn opens a lasting nftables connection inside namespace ns. The
// socket is made in the namespace at New; the caller closes it.
func nftConn(ns string) (*nftables.Conn, error) {
	f, err := os.Open(nsutil.Path(ns))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())), nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("nftables in %s: %w", ns, err)
	}
	return c, nil
}

// udpDport53 matches "meta l4proto udp udp dport 53".
func udpPort(offset uint32, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: offset, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func ip4Daddr(a [4]byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]},
	}
}

func installRules(t Topology) error {
	c, err := nftConn(t.NodeNS())
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName})
	switch {
	case t.LocalNAT:
	case t.Cache == CacheNode:
		// The node's own cache asks the VIP: kube-proxy's rules for
		// host processes DNAT it on OUTPUT.
		addNAT(c, tbl, t, nftables.ChainHookOutput, "to-dns", NodeUplink.Addr())
	default:
		addNAT(c, tbl, t, nftables.ChainHookPrerouting, "to-dns", NodeUplink.Addr())
	}
	fwd := c.AddChain(&nftables.Chain{
		Name: "forward", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter,
	})
	if t.DropAAAA {
		// udp dport 53 @th,(8+12+17)*8,16 28 drop: the question type of
		// the lab's fixed-length names.
		ex := udpPort(2, t.Port())
		ex = append(ex,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 8 + 12 + qnameWireLen, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(28)},
			&expr.Verdict{Kind: expr.VerdictDrop},
		)
		c.AddRule(&nftables.Rule{Table: tbl, Chain: fwd, Exprs: ex})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing node rules: %w", err)
	}
	for i := 0; i < t.Pods; i++ {
		if err := installPodCounters(t.PodNS(i)); err != nil {
			return err
		}
		if t.LocalNAT {
			if err := installPodNAT(t, i); err != nil {
				return err
			}
		}
	}
	if t.UDPTimeout > 0 {
		for _, ns := range t.NATNamespaces() {
			if err := writeSysctl(ns, "net.netfilter.nf_conntrack_udp_timeout", strconv.Itoa(t.UDPTimeout)); err != nil {
				return err
			}
		}
	}
	return nil
}

// installPodNAT puts the NAT rules in pod i's own namespace: its local
// sockets' queries are DNATed on OUTPUT and SNATed to the pod's own address
// on POSTROUTING, so conntrack confirms (and drops) them in the sender's
// namespace.
func installPodNAT(t Topology, i int) error {
	c, err := nftConn(t.PodNS(i))
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName})
	addNAT(c, tbl, t, nftables.ChainHookOutput, "eth0", PodAddr(i))
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing NAT rules in %s: %w", t.PodNS(i), err)
	}
	return nil
}

// addNAT adds kube-proxy's DNAT of the VIP on hook dnatHook (prerouting on
// the node, output in a sender's own namespace) and, when t.SNAT is set, an
// SNAT to snatAddr:t.SNATPorts for queries leaving through oif. Backends
// that are pods on the node's bridge are always SNATed to the bridge's
// address (the full port range unless t.SNAT narrows it), so their answers
// come back through the node. Both NAT chains are made either way, as
// kube-proxy does.
func addNAT(c *nftables.Conn, tbl *nftables.Table, t Topology, dnatHook *nftables.ChainHook, oif string, snatAddr netip.Addr) {
	dnat := c.AddChain(&nftables.Chain{
		Name: dnatChainName(t), Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: dnatHook, Priority: nftables.ChainPriorityNATDest,
	})
	addDNAT(c, tbl, dnat, t, allBackends(t))
	post := c.AddChain(&nftables.Chain{
		Name: "postrouting", Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource,
	})
	ports := t.SNATPorts
	switch {
	case t.BackendPods:
		oif, snatAddr = "br0", PodGateway.Addr()
		if !t.SNAT {
			ports = PortRange{1024, 65535}
		}
	case !t.SNAT:
		return
	}
	a := snatAddr.As4()
	ex := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(oif)},
	}
	// After DNAT the destination port is the backends' port.
	ex = append(ex, udpPort(2, t.Port())...)
	ex = append(ex,
		&expr.Immediate{Register: 1, Data: a[:]},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(ports.Min)},
		&expr.Immediate{Register: 3, Data: binaryutil.BigEndian.PutUint16(ports.Max)},
		&expr.NAT{
			Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4,
			RegAddrMin: 1, RegProtoMin: 2, RegProtoMax: 3, Specified: true,
			FullyRandom: t.RandomFully,
		},
	)
	c.AddRule(&nftables.Rule{Table: tbl, Chain: post, Exprs: ex})
}

// dnatChainName is the chain that DNATs the VIP: prerouting on the node,
// output where the NAT is the sender's own (a pod's, or the node's for its
// own cache).
func dnatChainName(t Topology) string {
	if t.LocalNAT || t.Cache == CacheNode {
		return "output"
	}
	return "prerouting"
}

func allBackends(t Topology) []int {
	b := make([]int, t.Backends)
	for i := range b {
		b[i] = i
	}
	return b
}

// addDNAT adds to chain the DNAT of the VIP to backends, kube-proxy
// (iptables mode) style: endpoint i is taken with probability 1/(K-i)
// among those left, so each new flow picks a backend uniformly at random,
// and two packets of one not yet confirmed flow may pick different ones.
func addDNAT(c *nftables.Conn, tbl *nftables.Table, chain *nftables.Chain, t Topology, backends []int) {
	for k, i := range backends {
		ex := append(ip4Daddr(VIP.As4()), udpPort(2, 53)...)
		if left := len(backends) - k; left > 1 {
			ex = append(ex,
				&expr.Numgen{Register: 1, Modulus: uint32(left), Type: unix.NFT_NG_RANDOM},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
			)
		}
		b := t.backendTarget(i).As4()
		ex = append(ex,
			&expr.Immediate{Register: 1, Data: b[:]},
			&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(t.Port())},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
		)
		c.AddRule(&nftables.Rule{Table: tbl, Chain: chain, Exprs: ex})
	}
}

func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

// Pod counters: queries a pod sent (output, udp dport 53) and answers it
// received (input, udp sport 53), counted by the kernel. A filter chain
// does not load conntrack, so the pod stays as untracked as a real one.
func installPodCounters(ns string) error {
	c, err := nftConn(ns)
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName})
	out := c.AddChain(&nftables.Chain{Name: "output", Table: tbl, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter})
	in := c.AddChain(&nftables.Chain{Name: "input", Table: tbl, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: out, Exprs: append(udpPort(2, 53), &expr.Counter{})})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: in, Exprs: append(udpPort(0, 53), &expr.Counter{})})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing counters in %s: %w", ns, err)
	}
	return nil
}

// podCounters reads a pod's sent-query and received-answer packet counts.
func podCounters(ns string) (sent, answers uint64, err error) {
	c, err := nftConn(ns)
	if err != nil {
		return 0, 0, err
	}
	defer c.CloseLasting()
	tbl := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	read := func(chain string) (uint64, error) {
		rules, err := c.GetRules(tbl, &nftables.Chain{Name: chain, Table: tbl})
		if err != nil {
			return 0, fmt.Errorf("reading %s counters in %s: %w", chain, ns, err)
		}
		for _, r := range rules {
			for _, e := range r.Exprs {
				if ctr, ok := e.(*expr.Counter); ok {
					return ctr.Packets, nil
				}
			}
		}
		return 0, fmt.Errorf("no %s counter in %s", chain, ns)
	}
	if sent, err = read("output"); err != nil {
		return
	}
	answers, err = read("input")
	return
}
