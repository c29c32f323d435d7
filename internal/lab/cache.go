package lab

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// A node-local DNS cache (NodeLocal DNSCache, a dnsmasq, systemd-resolved)
// answers pods itself and forwards upstream to the cluster VIP, so a pod's
// lookup stalls when the cache's upstream query is lost, not its own. The
// lab runs real dnsmasq as that cache, in one of two places:
//
//   - CachePod: a pod of its own on the node's bridge; the pods ask it
//     directly (bridged, never through the node's conntrack), and its
//     upstream queries cross the node's DNAT and SNAT like any pod's, where
//     a drop is silent.
//   - CacheNode: in the node's own namespace (NodeLocal DNSCache's
//     hostNetwork shape), listening on the bridge's address; the VIP is
//     DNATed in the node's OUTPUT chain, so a NAT drop of its upstream query
//     fails its send with EPERM, and dnsmasq resends at once.
//
// dnsmasq keeps no cache here (--cache-size=0), so every question goes
// upstream; it still joins a question already in flight from another pod
// to that one upstream query (coalescing): one lost upstream query stalls
// every pod that asked the same name meanwhile.
const (
	CachePod  = "pod"
	CacheNode = "node"
)

// CacheAddr is the address of the cache pod (Topology.Cache CachePod).
var CacheAddr = netip.AddrFrom4([4]byte{10, 244, 0, 250})

// CacheNS is the cache pod's namespace.
func (t Topology) CacheNS() string { return t.Prefix + "-cache" }

// Nameserver is the address the pods' resolv.conf names: the VIP, or the
// cache that forwards to it.
func (t Topology) Nameserver() netip.Addr {
	switch t.Cache {
	case CachePod:
		return CacheAddr
	case CacheNode:
		return PodGateway.Addr()
	}
	return VIP
}

// cacheLink is the cache pod's veth on the node's bridge.
const cacheLink = "cache"

// buildCachePod wires the cache pod like any pod, at CacheAddr.
func buildCachePod(t Topology) error {
	return onBridge(t, func(node *netlink.Handle, br netlink.Link) error {
		return plugIntoBridge(t.CacheNS(), cacheLink, netip.PrefixFrom(CacheAddr, 24), node, br)
	})
}

// plugIntoBridge gives namespace ns a veth on the node's bridge (named
// link on the node) with address a and a default route through the node.
func plugIntoBridge(ns, link string, a netip.Prefix, node *netlink.Handle, br netlink.Link) error {
	h, hNS, err := handle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	defer hNS.Close()
	v := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: link, MasterIndex: br.Attrs().Index},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(hNS),
	}
	if err := node.LinkAdd(v); err != nil {
		return fmt.Errorf("adding %s's veth: %w", ns, err)
	}
	if err := node.LinkSetUp(v); err != nil {
		return err
	}
	if err := linkUp(h, "lo"); err != nil {
		return err
	}
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := h.AddrAdd(eth, addrOf(a, 0)); err != nil {
		return err
	}
	if err := h.LinkSetUp(eth); err != nil {
		return err
	}
	return h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: PodGateway.Addr().AsSlice()})
}

// cacheProc is the running dnsmasq cache.
type cacheProc struct {
	cmd    *exec.Cmd
	exited <-chan error
}

// startCache runs dnsmasq as the topology's cache, forwarding to the VIP,
// and waits until it answers.
func startCache(t Topology) (*cacheProc, error) {
	bin, err := exec.LookPath("dnsmasq")
	if err != nil {
		return nil, fmt.Errorf("dnsmasq not installed (apt-get install dnsmasq-base): %w", err)
	}
	ns := t.CacheNS()
	if t.Cache == CacheNode {
		ns = t.NodeNS()
	}
	listen := t.Nameserver()
	args := []string{bin, "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
		"--bind-interfaces", "--listen-address=" + listen.String(), "--port=53", "--user=root", "--group=root",
		"--pid-file=", "--cache-size=0", "--server=" + VIP.String()}
	if t.CacheQueryPort != 0 {
		// One source port for every upstream query, as a forwarder with
		// a long-lived socket has: its conntrack entry lives as long as
		// it keeps asking.
		args = append(args, "--query-port="+strconv.Itoa(int(t.CacheQueryPort)))
	}
	cmd := nsutil.Command(context.Background(), ns, args...)
	cmd.Stderr = os.Stderr
	exited, err := nsutil.Start(cmd)
	if err != nil {
		return nil, fmt.Errorf("starting the dnsmasq cache: %w", err)
	}
	c := &cacheProc{cmd: cmd, exited: exited}
	for deadline := time.Now().Add(5 * time.Second); !listening(ns, netip.AddrPortFrom(listen, 53)); {
		if time.Now().After(deadline) {
			c.stop()
			return nil, fmt.Errorf("the dnsmasq cache did not start listening on %s", listen)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c, nil
}

func (c *cacheProc) stop() {
	if c == nil {
		return
	}
	_ = c.cmd.Cancel()
	<-c.exited
}

// buildExtras builds the cache pod and the backend pods, where the
// topology has them.
func buildExtras(t Topology) error {
	if t.Cache == CachePod {
		if err := buildCachePod(t); err != nil {
			return err
		}
	}
	if t.BackendPods {
		for i := 0; i < t.Backends; i++ {
			if err := addBackendPod(t, i); err != nil {
				return fmt.Errorf("backend pod %d: %w", i, err)
			}
		}
	}
	return nil
}
