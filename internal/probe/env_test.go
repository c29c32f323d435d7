package probe

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/event"
)

// twoNS is a client and a server network namespace joined by a veth pair:
// client 10.199.0.1/24 (dnsrace-t-c), server 10.199.0.2/24 (dnsrace-t-s).
// The namespaces are unnamed (held by file descriptors only), so nothing is
// left in /run/netns if a test dies, and a parallel lab teardown that
// removes namespaces by name cannot touch them.
type twoNS struct {
	client, server       netns.NsHandle
	clientIno, serverIno uint32
}

const (
	clientAddr = "10.199.0.1"
	serverAddr = "10.199.0.2"
	vipAddr    = "10.96.199.10" // DNATed to serverAddr in the server namespace

	clientAddr6 = "fd00:199::1"
	serverAddr6 = "fd00:199::2"
)

// addIPv6 adds clientAddr6/serverAddr6 (no duplicate address detection).
func (n *twoNS) addIPv6(t *testing.T) {
	t.Helper()
	for _, x := range []struct {
		ns   netns.NsHandle
		link string
		addr string
	}{{n.client, "dnsrace-t-c", clientAddr6}, {n.server, "dnsrace-t-s", serverAddr6}} {
		h, err := netlink.NewHandleAt(x.ns)
		if err != nil {
			t.Fatal(err)
		}
		l, err := h.LinkByName(x.link)
		if err == nil {
			a, _ := netlink.ParseAddr(x.addr + "/64")
			a.Flags = unix.IFA_F_NODAD
			err = h.AddrAdd(l, a)
		}
		h.Close()
		if err != nil {
			t.Fatalf("adding %s: %v", x.addr, err)
		}
	}
}

func newTwoNS(t *testing.T) *twoNS {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatalf("getting the current netns: %v", err)
	}
	defer orig.Close()

	mk := func() netns.NsHandle {
		h, err := netns.New() // also switches this thread into it
		if err != nil {
			t.Fatalf("creating a netns: %v", err)
		}
		if err := netns.Set(orig); err != nil {
			t.Fatalf("returning to the original netns: %v", err)
		}
		return h
	}
	n := &twoNS{client: mk(), server: mk()}
	t.Cleanup(func() { n.client.Close(); n.server.Close() })
	n.clientIno, n.serverIno = inode(t, n.client), inode(t, n.server)

	// veth pair created in the client namespace, peer moved to the server.
	hc, err := netlink.NewHandleAt(n.client)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	hs, err := netlink.NewHandleAt(n.server)
	if err != nil {
		t.Fatal(err)
	}
	defer hs.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: "dnsrace-t-c"},
		PeerName:      "dnsrace-t-s",
		PeerNamespace: netlink.NsFd(n.server),
	}
	if err := hc.LinkAdd(veth); err != nil {
		t.Fatalf("adding veth: %v", err)
	}
	up := func(h *netlink.Handle, name, addr string) {
		for _, ifn := range []string{"lo", name} {
			l, err := h.LinkByName(ifn)
			if err != nil {
				t.Fatalf("finding %s: %v", ifn, err)
			}
			if ifn != "lo" {
				a, _ := netlink.ParseAddr(addr + "/24")
				if err := h.AddrAdd(l, a); err != nil {
					t.Fatalf("adding %s to %s: %v", addr, ifn, err)
				}
			}
			if err := h.LinkSetUp(l); err != nil {
				t.Fatalf("setting %s up: %v", ifn, err)
			}
		}
	}
	up(hc, "dnsrace-t-c", clientAddr)
	up(hs, "dnsrace-t-s", serverAddr)
	_, vip, _ := net.ParseCIDR(vipAddr + "/32")
	cl, _ := hc.LinkByName("dnsrace-t-c")
	if err := hc.RouteAdd(&netlink.Route{LinkIndex: cl.Attrs().Index, Dst: vip, Gw: net.ParseIP(serverAddr)}); err != nil {
		t.Fatalf("adding route to the VIP: %v", err)
	}
	return n
}

func inode(t *testing.T, h netns.NsHandle) uint32 {
	var st unix.Stat_t
	if err := unix.Fstat(int(h), &st); err != nil {
		t.Fatal(err)
	}
	return uint32(st.Ino)
}

// nftRules installs one chain with one rule in ns over netlink (the VM
// guests have no nft binary). family/chain type/hook/priority as in nft.
func nftRules(t *testing.T, ns netns.NsHandle, family nftables.TableFamily, ctype nftables.ChainType,
	hook *nftables.ChainHook, prio *nftables.ChainPriority, exprs ...expr.Any) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatalf("nftables: %v", err)
	}
	tbl := c.AddTable(&nftables.Table{Family: family, Name: "dnsrace_t"})
	policy := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Name: "c", Table: tbl, Type: ctype, Hooknum: hook, Priority: prio, Policy: &policy})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: exprs})
	if err := c.Flush(); err != nil {
		t.Fatalf("installing nft rule: %v", err)
	}
}

// Rule fragments.
func ctStateNew() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

func udpDport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func ipDaddr(addr string) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net.ParseIP(addr).To4()},
	}
}

func dnatTo(addr string) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: net.ParseIP(addr).To4()},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
	}
}

// dnatToPort is dnat to addr:port.
func dnatToPort(addr string, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: net.ParseIP(addr).To4()},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

func join(parts ...[]expr.Any) []expr.Any {
	var all []expr.Any
	for _, p := range parts {
		all = append(all, p...)
	}
	return all
}

// inNS runs fn on a thread switched into ns. Sockets fn creates stay in
// ns afterwards.
func inNS(ns netns.NsHandle, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // not unlocked on failure: the thread then exits
		orig, err := netns.Get()
		if err != nil {
			done <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			done <- err
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// dial returns a UDP socket of the client namespace connected to dst.
func (n *twoNS) dial(t *testing.T, network, dst string, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := inNS(n.client, func() (err error) {
		c, err = net.DialUDP(network, nil, &net.UDPAddr{IP: net.ParseIP(dst), Port: port})
		return err
	})
	if err != nil {
		t.Fatalf("dialing %s:%d from the client netns: %v", dst, port, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// listen returns an unconnected UDP socket of the client namespace bound
// to no address (as musl's resolver sends, with sendto): the send hooks
// see no source address.
func (n *twoNS) listen(t *testing.T, network string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := inNS(n.client, func() (err error) {
		c, err = net.ListenUDP(network, nil)
		return err
	})
	if err != nil {
		t.Fatalf("opening an unconnected socket in the client netns: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// exchange writes query on conn (to to, when conn is not connected) and
// waits up to 5 s for the reply.
func exchange(conn *net.UDPConn, to *net.UDPAddr, query []byte) error {
	var err error
	if to == nil {
		_, err = conn.Write(query)
	} else {
		_, err = conn.WriteTo(query, to)
	}
	if err != nil {
		return err
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _, err = conn.ReadFrom(make([]byte, 512))
	return err
}

// sendUDP sends payload from the client namespace to dst:port.
func (n *twoNS) sendUDP(t *testing.T, dst string, port int, payload []byte) {
	t.Helper()
	network := "udp4"
	if strings.Contains(dst, ":") {
		network = "udp6"
	}
	c := n.dial(t, network, dst, port)
	if _, err := c.Write(payload); err != nil {
		t.Fatalf("sending to %s:%d: %v", dst, port, err)
	}
}

// serverSocket is a UDP socket of the server namespace bound to
// addr:port, closed when the test ends.
func (n *twoNS) serverSocket(t *testing.T, addr string, port int) *net.UDPConn {
	t.Helper()
	var pc *net.UDPConn
	err := inNS(n.server, func() (err error) {
		pc, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(addr), Port: port})
		return err
	})
	if err != nil {
		t.Fatalf("listening on %s:%d in the server netns: %v", addr, port, err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc
}

// serveDNS answers every query on addr:53 in the server namespace with
// rcode (no answer records) until the test ends, repeat times each.
func (n *twoNS) serveDNS(t *testing.T, addr string, rcode, repeat int) {
	n.serveDNSPort(t, addr, 53, rcode, repeat)
}

// serveDNSPort is serveDNS on another port.
func (n *twoNS) serveDNSPort(t *testing.T, addr string, port, rcode, repeat int) {
	t.Helper()
	pc := n.serverSocket(t, addr, port)
	go func() {
		buf := make([]byte, 512)
		for {
			nr, from, err := pc.ReadFromUDP(buf)
			if err != nil {
				return
			}
			var q dns.Msg
			if q.Unpack(buf[:nr]) != nil {
				continue
			}
			r := new(dns.Msg)
			r.SetRcode(&q, rcode)
			if b, err := r.Pack(); err == nil {
				for range repeat {
					pc.WriteToUDP(b, from)
				}
			}
		}
	}()
}

func dnsQuery(t *testing.T, name string, qtype uint16) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// collector runs Tracer.Read in the background and keeps copies.
type collector struct {
	mu     sync.Mutex
	events []event.Event
	cancel context.CancelFunc
	done   chan error
}

func collect(t *testing.T, tr *Tracer) *collector {
	ctx, cancel := context.WithCancel(context.Background())
	c := &collector{cancel: cancel, done: make(chan error, 1)}
	go func() {
		c.done <- tr.Read(ctx, func(e *event.Event) {
			c.mu.Lock()
			c.events = append(c.events, *e)
			c.mu.Unlock()
		}, nil)
	}()
	t.Cleanup(c.stop)
	return c
}

func (c *collector) stop() {
	c.cancel()
	<-c.done
	c.done <- nil // later stops return at once
}

// query waits for the QUERY record of qname and returns it.
func (c *collector) query(t *testing.T, qname string) event.Event {
	t.Helper()
	q, ok := c.wait(5*time.Second, func(e *event.Event) bool { return e.Kind == event.KindQuery && hasName(e, qname) })
	if !ok {
		c.dump(t)
		t.Fatalf("no QUERY record for %s", qname)
	}
	return q
}

// of returns the records about query qid, the QUERY record included.
func (c *collector) of(qid uint64) []event.Event {
	var out []event.Event
	for _, e := range c.all() {
		if e.QID == qid {
			out = append(out, e)
		}
	}
	return out
}

// wait polls until match returns true for some event or the timeout.
func (c *collector) wait(timeout time.Duration, match func(*event.Event) bool) (event.Event, bool) {
	deadline := time.Now().Add(timeout)
	for {
		c.mu.Lock()
		for i := range c.events {
			if match(&c.events[i]) {
				e := c.events[i]
				c.mu.Unlock()
				return e, true
			}
		}
		c.mu.Unlock()
		if time.Now().After(deadline) {
			return event.Event{}, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *collector) all() []event.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]event.Event(nil), c.events...)
}

func (c *collector) dump(t *testing.T) {
	for _, e := range c.all() {
		t.Logf("  %s", describe(&e))
	}
}

func describe(e *event.Event) string {
	return fmt.Sprintf("%-12s %-10s qid=%#x netns=%d %s q=%s/%d ct=%#x st=%#x winner=%#x reason=%s flags=%#x",
		e.Kind, e.Tier, e.QID, e.NetNS, e.Packet, e.DNS.QName(), e.DNS.QType, e.CT.Ptr, e.CT.Status,
		e.Winner.Ptr, DropReasonName(e.Reason), e.Flags)
}
