package probe

import (
	"context"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// TestFreshFlowsSurviveFullMap: queries nobody answers (an upstream that
// loses them, a rule that drops them) keep their flows until the LRU
// evicts them, so on a node with steady loss the flow map is full and
// every new query's insert evicts an entry. The entry evicted must be an
// old unanswered one, never the flow of a query whose answer is still on
// its way. Here the map (1,024 flows, and the LRU's per-CPU room on top:
// addLRURoom) is filled four times over by queries
// that a server takes and never answers and queries that a rule in its
// namespace drops (hooks look their flows up after the insert: the
// tracepoint tier's at the server's device, every tier's drop hook);
// while more of those keep coming, 8 sockets with 16 queries each in
// flight ask an answering server 4,096 times. Every answer must find its
// query's flow in the kernel: an ANSWER record with the query's id. The
// test checks that the map really was full and evicting the whole time
// (evictions = flows the client namespace made - answered - still held);
// with a map smaller than the queries in flight its tun case fails.
//
// The answering server is in the server namespace (veth), or behind a tun
// device of the client namespace (tun): a server off the machine, as a
// node's own resolver or NodeLocal DNSCache asks, where no hook of any
// tier sees a query between its send and its answer.
func TestFreshFlowsSurviveFullMap(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	t.Run("veth", func(t *testing.T) { freshFlowsSurviveFullMap(t, false) })
	t.Run("tun", func(t *testing.T) { freshFlowsSurviveFullMap(t, true) })
}

func freshFlowsSurviveFullMap(t *testing.T, viaTun bool) {
	const (
		entries    = 1024
		silentPort = 5353 // taken, never answered
		dropPort   = 5354 // dropped by a rule at the server
		fill       = 4 * entries
		sockets    = 8
		inFlight   = 16
		rounds     = 32
		burst      = 256 // unanswered queries sent in each round
	)
	n := newTwoNS(t)
	answerer := serverAddr
	if viaTun {
		answerer = n.tunServer(t)
	} else {
		n.serveDNS(t, serverAddr, dns.RcodeSuccess, 1)
	}
	n.swallowDNS(t, serverAddr, silentPort)
	nftRules(t, n.server, nftables.TableFamilyINet, nftables.ChainTypeFilter,
		nftables.ChainHookInput, nftables.ChainPriorityFilter,
		join(udpDport(dropPort), []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}})...)
	tr := openTier(t, Options{Attach: testTier(t), Ports: []uint16{53, silentPort, dropPort}, FlowEntries: entries})

	// Counted in the client namespace only: other tests may run traffic
	// on this machine meanwhile.
	var answered atomic.Uint64
	ctx, cancel := context.WithCancel(context.Background())
	readDone := make(chan error, 1)
	go func() {
		readDone <- tr.Read(ctx, func(e *event.Event) {
			if e.Kind == event.KindAnswer && e.NetNS == n.clientIno && e.QID != 0 {
				answered.Add(1)
			}
		}, nil)
	}()
	defer func() { cancel(); <-readDone }()
	held := func() (k int) {
		forEachEntry(t, tr, "flows", func(_, v []byte) {
			if flowNetNS(v) == n.clientIno {
				k++
			}
		})
		return k
	}

	unanswered := []*net.UDPConn{n.dial(t, "udp4", serverAddr, silentPort), n.dial(t, "udp4", serverAddr, dropPort)}
	var silentID uint16
	sendSilent := func(k int) {
		for range k {
			if _, err := unanswered[silentID%2].Write(queryWithID(t, silentID)); err != nil {
				t.Fatalf("unanswered query: %v", err)
			}
			silentID++
		}
	}
	sendSilent(fill)
	// Flows are inserted in the sender's context, by the send or the
	// first device, so they are all in once the writes returned.
	heldBefore := held()
	if heldBefore < entries*3/4 {
		t.Fatalf("after %d unanswered queries the map holds %d of their flows: it has room for %d", fill, heldBefore, entries)
	}

	conns := make([]*net.UDPConn, sockets)
	for i := range conns {
		conns[i] = n.dial(t, "udp4", answerer, 53)
	}
	// One round: 16 queries on each socket, a burst of unanswered ones,
	// then the 128 answers. So while a query waits for its answer at most
	// 128 + 256 flows are inserted, well under the map's size: an LRU
	// evicts older flows first.
	buf := make([]byte, 512)
	received, silentDuring := 0, 0
	for r := range rounds {
		for _, conn := range conns {
			for i := range inFlight {
				if _, err := conn.Write(queryWithID(t, uint16(r*inFlight+i))); err != nil {
					t.Fatalf("query: %v", err)
				}
			}
		}
		sendSilent(burst)
		silentDuring += burst
		for _, conn := range conns {
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			for range inFlight {
				if _, err := conn.Read(buf); err != nil {
					t.Fatalf("answer: %v", err)
				}
				received++
			}
		}
	}
	asked := uint64(sockets * inFlight * rounds)
	if received != int(asked) {
		t.Fatalf("%d answers received of %d asked", received, asked)
	}

	deadline := time.Now().Add(5 * time.Second)
	for answered.Load() < asked && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	heldAfter := held()
	evicted := silentDuring + int(asked) - int(answered.Load()) - (heldAfter - heldBefore)
	t.Logf("while answered: %d unanswered queries more, %d flows evicted, %d held (%d flows and the LRU's room)", silentDuring, evicted, heldAfter, entries)
	if evicted < silentDuring/2 {
		t.Errorf("%d flows evicted while %d unanswered queries were added to a full map: it was not evicting", evicted, silentDuring)
	}
	if got := answered.Load(); got != asked {
		t.Errorf("%d ANSWER records for %d answered queries: the others' flows were evicted before their answers (%d records lost)", got, asked, tr.Lost())
	}
}

// swallowDNS reads every datagram to addr:port in the server namespace and
// answers none, until the test ends: an upstream that loses queries after
// taking them (no drop at its socket, whose buffer is made large).
func (n *twoNS) swallowDNS(t *testing.T, addr string, port int) {
	t.Helper()
	pc := n.serverSocket(t, addr, port)
	// SO_RCVBUFFORCE: past net.core.rmem_max, which holds a few hundred
	// small datagrams.
	rc, err := pc.SyscallConn()
	if err == nil {
		cerr := rc.Control(func(fd uintptr) {
			err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
		})
		if cerr != nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatalf("sizing the silent server's receive buffer: %v", err)
	}
	go func() {
		buf := make([]byte, 512)
		for {
			if _, err := pc.Read(buf); err != nil {
				return
			}
		}
	}()
}

// tunServer makes a tun device in the client namespace (10.199.1.1/24)
// and answers every DNS query sent through it (to tunRemote) from this
// process, until the test ends; it returns tunRemote. Only the client's
// devices see the queries and the answers.
func (n *twoNS) tunServer(t *testing.T) string {
	t.Helper()
	const name, local, tunRemote = "dnsrace-t-tun", "10.199.1.1/24", "10.199.1.53"
	var tun *os.File
	err := inNS(n.client, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		ifr, err := unix.NewIfreq(name)
		if err == nil {
			ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
			err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		}
		if err != nil {
			unix.Close(fd)
			return err
		}
		tun = os.NewFile(uintptr(fd), name) // non-blocking: Close ends a Read
		return nil
	})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) {
		testutil.SkipOrFail(t, "no tun device here (/dev/net/tun): "+err.Error())
	}
	if err != nil {
		t.Fatalf("creating a tun device in the client namespace: %v", err)
	}
	t.Cleanup(func() { tun.Close() }) // the last close removes the device
	h, err := netlink.NewHandleAt(n.client)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err == nil {
		a, _ := netlink.ParseAddr(local)
		if err = h.AddrAdd(l, a); err == nil {
			err = h.LinkSetUp(l)
		}
	}
	if err != nil {
		t.Fatalf("setting %s up: %v", name, err)
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			nr, err := tun.Read(buf)
			if err != nil {
				return
			}
			if reply := dnsReply(buf[:nr]); reply != nil {
				tun.Write(reply)
			}
		}
	}()
	return tunRemote
}

// dnsReply is the IPv4 packet answering the DNS query in IPv4 packet pkt
// (NOERROR, no records), or nil.
func dnsReply(pkt []byte) []byte {
	p := gopacket.NewPacket(pkt, layers.LayerTypeIPv4, gopacket.NoCopy)
	ip, _ := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	udp, _ := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
	var q dns.Msg
	if ip == nil || udp == nil || udp.DstPort != 53 || q.Unpack(udp.Payload) != nil {
		return nil
	}
	r := new(dns.Msg)
	r.SetRcode(&q, dns.RcodeSuccess)
	payload, err := r.Pack()
	if err != nil {
		return nil
	}
	rip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: ip.DstIP, DstIP: ip.SrcIP}
	rudp := &layers.UDP{SrcPort: udp.DstPort, DstPort: udp.SrcPort}
	rudp.SetNetworkLayerForChecksum(rip)
	out := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if gopacket.SerializeLayers(out, opts, rip, rudp, gopacket.Payload(payload)) != nil {
		return nil
	}
	return out.Bytes()
}

// queryWithID is an A query for a fixed name with DNS id id: the flow key
// of a socket's queries in flight is their id.
func queryWithID(t *testing.T, id uint16) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("fullmap.dnsrace.test.", dns.TypeA)
	m.Id = id
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
