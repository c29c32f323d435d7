package probe

import (
	"errors"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"github.com/miekg/dns"
	"github.com/ti-mo/conntrack"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// TestReplyHolderAtReusedAddress: a socket's entry is freed and the
// socket's next packet makes a new entry, with the same original tuple but
// another SNAT port, which the slab may place at the freed entry's address
// (from 7.0 nearly always: a CPU's next object is the one it freed last).
// A later flow given the same port loses to it at confirm, and the loser's
// records must name it as the winner. The tracepoint tier knows entries by
// address: an old entry's mark there must not hide the new one.
//
// Each attempt, on one thread pinned to one CPU in the client namespace:
// SNAT to port a; socket 1 sends (entry E1, reply port a); socket 2 sends,
// loses to E1 (insert_failed, EPERM); SNAT to port b; E1 deleted; socket
// 1 sends (entry E2, reply port b); socket 3 sends, loses to E2. The test
// is done once E2 took E1's address; attempts where it did not test
// nothing of this, and a kernel that never reuses skips.
func TestReplyHolderAtReusedAddress(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	n := newTwoNS(t)
	tr := openTier(t, Options{Attach: testTier(t)})
	c := collect(t, tr)
	msg := dnsQuery(t, uniqueName(t), dns.TypeA)
	client := netip.MustParseAddr(clientAddr)
	server := netip.AddrPortFrom(netip.MustParseAddr(serverAddr), 53)

	// winner is the entry named as the winner of the race lost by the
	// query from srcPort: on its drop (tracepoint tier) or at confirm's
	// NF_DROP (fentry/kprobe: nf_ct_resolve_clash's).
	winner := func(srcPort uint16) (event.CT, bool) {
		e, ok := c.wait(5*time.Second, func(e *event.Event) bool {
			return (e.Kind == event.KindDrop || e.Kind == event.KindConfirmDrop) && e.Flags&event.FlagWinner != 0 &&
				e.NetNS == n.clientIno && e.CT.Orig.Src.Port() == srcPort
		})
		return e.Winner, ok
	}
	const attempts = 20
	for i := range attempts {
		portA := uint16(20000 + 2*i)
		portB := portA + 1
		src := uint16(41000 + 3*i) // sockets 1, 2, 3: src, src+1, src+2
		if err := onPinnedThread(n.client, func() error { return reuseAttempt(n, msg, portA, portB, src) }); err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
		w1, ok := winner(src + 1)
		if !ok || w1.Reply.Dst != netip.AddrPortFrom(client, portA) {
			c.dump(t)
			t.Fatalf("attempt %d: the first loser's winner %+v (found %v), want the holder of reply port %d", i, w1, ok, portA)
		}
		w2, ok := winner(src + 2)
		if !ok {
			c.dump(t)
			t.Fatalf("attempt %d: the second loser (port %d) has no winner; E1 was at %#x", i, portB, w1.Ptr)
		}
		if w2.Reply.Dst != netip.AddrPortFrom(client, portB) || w2.Orig.Src != netip.AddrPortFrom(client, src) ||
			w2.Orig.Dst != server {
			t.Fatalf("attempt %d: the second loser's winner %s -> %s, reply %s -> %s; want socket 1's new entry on port %d",
				i, w2.Orig.Src, w2.Orig.Dst, w2.Reply.Src, w2.Reply.Dst, portB)
		}
		if w2.Ptr == w1.Ptr {
			t.Logf("attempt %d: E2 took E1's address %#x and was named the winner", i, w1.Ptr)
			return
		}
		t.Logf("attempt %d: E2 at %#x, E1 was at %#x: not reused", i, w2.Ptr, w1.Ptr)
	}
	t.Skipf("in %d attempts the slab never gave socket 1's new entry the address of its old one: nothing tested", attempts)
}

// reuseAttempt runs one attempt's packets and changes (see
// TestReplyHolderAtReusedAddress), on the calling thread: in the client
// namespace, pinned to one CPU.
func reuseAttempt(n *twoNS, msg []byte, portA, portB, src uint16) error {
	clientIP := [4]byte(netip.MustParseAddr(clientAddr).As4())
	dst := &unix.SockaddrInet4{Port: 53, Addr: [4]byte(netip.MustParseAddr(serverAddr).As4())}
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	send := func(port uint16, refused bool) error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		fds = append(fds, fd)
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(port), Addr: clientIP}); err != nil {
			return err
		}
		return sendFrom(fd, msg, dst, refused)
	}
	if err := setSNATPort(n.client, portA); err != nil {
		return err
	}
	if err := send(src, false); err != nil {
		return err
	}
	if err := send(src+1, true); err != nil {
		return err
	}
	if err := setSNATPort(n.client, portB); err != nil {
		return err
	}
	if err := deleteEntry(n.client, netip.AddrPortFrom(netip.AddrFrom4(clientIP), src), dst); err != nil {
		return err
	}
	if err := sendFrom(fds[0], msg, dst, false); err != nil {
		return err
	}
	return send(src+2, true)
}

// sendFrom sends msg on fd; refused: the send must fail with EPERM (the
// entry lost at confirm in this namespace's own POSTROUTING).
func sendFrom(fd int, msg []byte, dst *unix.SockaddrInet4, refused bool) error {
	err := unix.Sendto(fd, msg, 0, dst)
	switch {
	case refused && !errors.Is(err, unix.EPERM):
		return errors.New("a send that must lose its race at confirm was not refused with EPERM: " + errString(err))
	case !refused && err != nil:
		return err
	}
	return nil
}

func errString(err error) string {
	if err == nil {
		return "it went out"
	}
	return err.Error()
}

// setSNATPort makes the namespace's one rule source-NAT UDP to port 53 to
// clientAddr:port (a range of one port: a second flow gets it too, and
// loses at confirm).
func setSNATPort(ns netns.NsHandle, port uint16) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return err
	}
	tbl := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: "dnsrace_snat"}
	c.DelTable(tbl)
	_ = c.Flush() // absent the first time
	c.AddTable(tbl)
	policy := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Name: "post", Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &policy})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: join(udpDport(53), []expr.Any{
		&expr.Immediate{Register: 1, Data: netip.MustParseAddr(clientAddr).AsSlice()},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	})})
	return c.Flush()
}

// deleteEntry deletes the entry whose original tuple is src -> dst (UDP)
// over ctnetlink. The request runs on the calling thread, so the entry is
// freed on its CPU.
func deleteEntry(ns netns.NsHandle, src netip.AddrPort, dst *unix.SockaddrInet4) error {
	c, err := conntrack.Dial(&netlink.Config{NetNS: int(ns)})
	if err != nil {
		return err
	}
	defer c.Close()
	var f conntrack.Flow
	f.TupleOrig.IP.SourceAddress, f.TupleOrig.IP.DestinationAddress = src.Addr(), netip.AddrFrom4(dst.Addr)
	f.TupleOrig.Proto.Protocol, f.TupleOrig.Proto.SourcePort, f.TupleOrig.Proto.DestinationPort = unix.IPPROTO_UDP, src.Port(), uint16(dst.Port)
	return c.Delete(f)
}

// onPinnedThread runs fn on a thread switched into ns and pinned to CPU
// 0, so that what fn frees and then allocates is one CPU's.
func onPinnedThread(ns netns.NsHandle, fn func() error) error {
	return inNS(ns, func() error {
		var set unix.CPUSet
		set.Set(0)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return err
		}
		defer func() {
			var all unix.CPUSet
			for i := range runtime.NumCPU() {
				all.Set(i)
			}
			_ = unix.SchedSetaffinity(0, &all)
		}()
		return fn()
	})
}
