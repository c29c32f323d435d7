package trace

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// TestUpstreamTCPKeptBriefly: whether a namespace asks DNS over TCP is
// read from the kernel (sock_diag) in the namespace, and the answer is
// kept tcpReread: a connection opened meanwhile shows once it is over.
func TestUpstreamTCPKeptBriefly(t *testing.T) {
	testutil.RequireRoot(t)
	name := fmt.Sprintf("dnsrace-tcpread-%d", os.Getpid())
	if err := nsutil.Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nsutil.Delete(name) })
	ino, err := nsutil.Inode(name)
	if err != nil {
		t.Fatal(err)
	}
	owners := func() *addrOwners {
		return &addrOwners{ns: &namespaces{alive: map[uint32]string{ino: nsutil.Path(name)}}}
	}
	a := owners()
	if a.upstreamTCP(ino) {
		t.Fatal("a new namespace asks over TCP")
	}
	// A DNS connection over TCP in the namespace, to its own loopback.
	var conns []net.Conn
	err = nsutil.Do(name, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		ln, err := net.Listen("tcp4", "127.0.0.1:53")
		if err != nil {
			return err
		}
		t.Cleanup(func() { ln.Close() })
		c, err := net.Dial("tcp4", "127.0.0.1:53")
		if err != nil {
			return err
		}
		s, err := ln.Accept()
		if err != nil {
			return err
		}
		conns = append(conns, c, s)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	if !owners().upstreamTCP(ino) {
		t.Fatal("an established connection to port 53 is not seen")
	}
	if a.upstreamTCP(ino) {
		t.Error("the answer read a moment ago was not kept")
	}
	time.Sleep(tcpReread + 50*time.Millisecond)
	if !a.upstreamTCP(ino) {
		t.Errorf("the connection is not seen %v later", tcpReread)
	}
}
