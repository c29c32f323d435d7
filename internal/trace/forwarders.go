package trace

import (
	"net/netip"
	"os"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The correlator ties a pod's stall to a local forwarder's lost query
// (correlate/forwarder.go): it asks which namespace holds the address the
// pod asked, and whether that namespace asks upstream over TCP. Both are
// read here, over netlink in the namespaces, only when a stall needs it.

// addrRescan bounds how often a missing address rebuilds the map.
const addrRescan = 5 * time.Second

// addrOwners maps the addresses of every living namespace to it. It is the
// session reader's alone.
type addrOwners struct {
	ns     *namespaces
	owners map[netip.Addr]uint32
	at     time.Time
}

// owner returns the namespace that holds a; the map is rebuilt when a is
// missing from it and it is older than addrRescan (a pod born since).
func (a *addrOwners) owner(addr netip.Addr) (uint32, bool) {
	addr = addr.Unmap()
	if ino, ok := a.owners[addr]; ok {
		return ino, true
	}
	if time.Since(a.at) < addrRescan {
		return 0, false
	}
	a.at = time.Now()
	a.owners = map[netip.Addr]uint32{}
	for ino, path := range a.ns.living() {
		_ = inNamespace(path, func(h *netlink.Handle) error {
			addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
			if err != nil {
				return err
			}
			for _, ad := range addrs {
				ip, ok := netip.AddrFromSlice(ad.IP)
				if !ok || ip.IsLoopback() {
					continue
				}
				if _, taken := a.owners[ip.Unmap()]; !taken {
					a.owners[ip.Unmap()] = ino
				}
			}
			return nil
		}, unix.NETLINK_ROUTE)
	}
	ino, ok := a.owners[addr]
	return ino, ok
}

// upstreamTCP reports whether namespace ino has TCP connections to DNS
// servers (port 53) established: a forwarder there that asks upstream over
// TCP (NodeLocal DNSCache's force_tcp).
func (a *addrOwners) upstreamTCP(ino uint32) bool {
	path, ok := a.ns.livingPath(ino)
	if !ok {
		return false
	}
	found := false
	_ = inNamespace(path, func(h *netlink.Handle) error {
		for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
			socks, err := h.SocketDiagTCP(fam)
			if err != nil {
				return err
			}
			for _, s := range socks {
				if s.ID.DestinationPort == 53 && s.State == netlink.TCP_ESTABLISHED {
					found = true
					return nil
				}
			}
		}
		return nil
	}, unix.NETLINK_INET_DIAG)
	return found
}

// inNamespace runs fn with a netlink handle of the given families in the
// namespace at path.
func inNamespace(path string, fn func(*netlink.Handle) error, families ...int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h, err := netlink.NewHandleAt(netns.NsHandle(int(f.Fd())), families...)
	if err != nil {
		return err
	}
	defer h.Close()
	return fn(h)
}
