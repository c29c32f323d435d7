package lab

import (
	"fmt"
	"net/netip"
	"os"
	"slices"

	"github.com/google/nftables"
	mnl "github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/dnsserver"
	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/vishvananda/netlink"
)

// Backends as pods (Topology.BackendPods): each DNS backend is a pod of
// its own on the node's bridge, as CoreDNS pods are on a kubenet node, so
// one can be deleted the way a rollout deletes it (ReplaceBackend). The
// node masquerades what it sends them to its bridge address, so their
// answers come back through its conntrack even to pods on the same bridge.

// BackendPodAddr is backend pod i's address.
func BackendPodAddr(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, 0, byte(200 + i)}) }

// BackendNS is backend pod i's namespace.
func (t Topology) BackendNS(i int) string { return fmt.Sprintf("%s-be%d", t.Prefix, i) }

// backendTarget is what the VIP is DNATed to for backend i.
func (t Topology) backendTarget(i int) netip.Addr {
	if t.BackendPods {
		return BackendPodAddr(i)
	}
	return BackendAddr(i)
}

func backendLink(i int) string { return fmt.Sprintf("be%d", i) }

// addBackendPod creates backend pod i and wires it to the bridge.
func addBackendPod(t Topology, i int) error {
	if err := nsutil.Create(t.BackendNS(i)); err != nil {
		return err
	}
	return onBridge(t, func(node *netlink.Handle, br netlink.Link) error {
		return plugIntoBridge(t.BackendNS(i), backendLink(i), netip.PrefixFrom(BackendPodAddr(i), 24), node, br)
	})
}

// startBackendPod starts backend pod i's DNS server.
func startBackendPod(t Topology, i int, cfg ServerConfig) (*dnsserver.Server, error) {
	var srv *dnsserver.Server
	err := nsutil.Do(t.BackendNS(i), func() error {
		var err error
		srv, err = dnsserver.Start(dnsserver.Config{Addr: netip.AddrPortFrom(BackendPodAddr(i), t.Port()), IgnoreFraction: cfg.IgnoreFraction})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("starting backend pod %d's server: %w", i, err)
	}
	return srv, nil
}

// ReplaceBackend does to backend pod old what a CoreDNS rollout does when
// nothing flushes conntrack: the pod is deleted (its veth removed, as CNI
// does, then its namespace), backend pod new starts, and the VIP's DNAT is
// pointed at it. Entries the node made to old stay, and a client that
// keeps its source port keeps being sent to old's address.
func (l *Lab) ReplaceBackend(old, new int) error {
	t := l.Topology
	if !t.BackendPods {
		return fmt.Errorf("replacing backend %d: the lab's backends are not pods", old)
	}
	if srv := l.servers.byBackend[old]; srv != nil {
		srv.Close()
		delete(l.servers.byBackend, old)
	}
	if err := unplug(t.NodeNS(), backendLink(old)); err != nil {
		return fmt.Errorf("replacing backend %d: %w", old, err)
	}
	if err := nsutil.Delete(t.BackendNS(old)); err != nil {
		return fmt.Errorf("replacing backend %d: %w", old, err)
	}
	if err := addBackendPod(t, new); err != nil {
		return fmt.Errorf("replacing backend %d by %d: %w", old, new, err)
	}
	srv, err := startBackendPod(t, new, l.servers.cfg)
	if err != nil {
		return err
	}
	l.servers.byBackend[new] = srv
	l.active = slices.DeleteFunc(l.active, func(i int) bool { return i == old })
	l.active = append(l.active, new)
	return l.pointVIP(l.active)
}

// pointVIP rewrites the node's DNAT of the VIP to the given backends,
// leaving conntrack as it is.
func (l *Lab) pointVIP(backends []int) error {
	t := l.Topology
	c, err := nftConn(t.NodeNS())
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	tbl := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName}
	ch := &nftables.Chain{Name: dnatChainName(t), Table: tbl}
	c.FlushChain(ch)
	addDNAT(c, tbl, ch, t, backends)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("pointing the VIP at backends %v: %w", backends, err)
	}
	return nil
}

// ActiveBackends lists the backends the VIP is DNATed to now.
func (l *Lab) ActiveBackends() []int { return slices.Clone(l.active) }

// staleEntries counts the node's conntrack entries for the VIP whose
// reply comes from a backend the VIP is no longer DNATed to.
func staleEntries(t Topology, active []int) (int, error) {
	f, err := os.Open(nsutil.Path(t.NodeNS()))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	c, err := conntrack.Dial(&mnl.Config{NetNS: int(f.Fd())})
	if err != nil {
		return 0, fmt.Errorf("reading the node's conntrack table: %w", err)
	}
	defer c.Close()
	flows, err := c.Dump(nil)
	if err != nil {
		return 0, fmt.Errorf("reading the node's conntrack table: %w", err)
	}
	live := map[netip.Addr]bool{}
	for _, i := range active {
		live[t.backendTarget(i)] = true
	}
	n := 0
	for _, fl := range flows {
		o, r := fl.TupleOrig, fl.TupleReply
		if o.Proto.Protocol == unix.IPPROTO_UDP && o.IP.DestinationAddress == VIP && o.Proto.DestinationPort == 53 &&
			!live[r.IP.SourceAddress] {
			n++
		}
	}
	return n, nil
}
