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

// tcpReread is how long a namespace's upstreamTCP answer is kept: a flood
// of stalls at one local server asks it for every stall, and each read is
// a netlink socket opened in the namespace and two dumps (3.8 ms on the
// host; in an emulated guest 2,300 stalls held a count pass's stop 32 s).
const tcpReread = time.Second

// addrOwners maps the addresses of every living namespace to it. It is the
// session reader's alone.
type addrOwners struct {
	ns     *namespaces
	owners map[netip.Addr]uint32
	at     time.Time
	tcp    map[uint32]tcpRead // upstreamTCP's answers, by namespace
}

type tcpRead struct {
	tcp bool
	at  time.Time
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
	a.owners = map[netip.Addr]uint32{}
	// Timed from the rebuild's end: one that took longer than addrRescan
	// must not make every next miss rebuild again.
	defer func() { a.at = time.Now() }()
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
// TCP (NodeLocal DNSCache's force_tcp). An answer is kept tcpReread.
func (a *addrOwners) upstreamTCP(ino uint32) bool {
	if r, ok := a.tcp[ino]; ok && time.Since(r.at) < tcpReread {
		return r.tcp
	}
	if a.tcp == nil || len(a.tcp) > maxTCPReads {
		a.tcp = map[uint32]tcpRead{}
	}
	found := a.readUpstreamTCP(ino)
	a.tcp[ino] = tcpRead{tcp: found, at: time.Now()}
	return found
}

// maxTCPReads bounds the namespaces upstreamTCP keeps answers for.
const maxTCPReads = 1024

func (a *addrOwners) readUpstreamTCP(ino uint32) bool {
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
