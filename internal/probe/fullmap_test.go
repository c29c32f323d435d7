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

// TestFullFlowTable: queries nobody answers (an upstream that loses them,
// a rule that drops them) keep their flows until the sweeper removes them
// (FlowMaxAge after their last sight), so on a node with steady loss the
// flow table may fill. Nothing is lost unnoticed then: a query the full
// table had no room for says so in its QUERY record (untracked, counted in
// FlowsRefused), the sweeper evicts the oldest flows to make room
// (counted, and each evicted query reported untracked) so that fresh
// queries are tracked again at its next sweep, every other answered query
// gets its ANSWER record, and once older than
// FlowMaxAge the unanswered flows are swept, leaving the table empty.
//
// The table (1,024 flows) is filled four times over by queries that a
// server takes and never answers and queries that a rule in its namespace
// drops; while more of those keep coming, 8 sockets with 16 queries each
// in flight ask an answering server 4,096 times. The answering server is
// in the server namespace (veth), or behind a tun device of the client
// namespace (tun): a server off the machine, as a node's own resolver or
// NodeLocal DNSCache asks, where no hook of any tier sees a query between
// its send and its answer.
func TestFullFlowTable(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	t.Run("veth", func(t *testing.T) { fullFlowTable(t, false, false) })
	t.Run("tun", func(t *testing.T) { fullFlowTable(t, true, false) })
	// as on kernels without bpf_for_each_map_elem (before 5.13): the
	// syscalls are the same in every tier and kernel, so the VM matrix
	// (which sets the tier) leaves it to the host and to 5.10's veth run
	t.Run("veth-syscalls", func(t *testing.T) {
		if os.Getenv("DNSRACE_TEST_TIER") != "" {
			t.Skip("the syscall sweep runs on the host (no DNSRACE_TEST_TIER)")
		}
		fullFlowTable(t, false, true)
	})
}

func fullFlowTable(t *testing.T, viaTun, bySyscalls bool) {
	const (
		entries    = 1024
		maxAge     = 2 * time.Second
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
	tr := openTier(t, Options{Attach: testTier(t), Ports: []uint16{53, silentPort, dropPort}, FlowEntries: entries, FlowMaxAge: maxAge, sweepBySyscalls: bySyscalls})

	// Counted in the client namespace only: other tests may run traffic
	// on this machine meanwhile. The answered queries are those to port
	// 53 of the answering server.
	// An answered query is untracked when its QUERY record says so or
	// the sweeper evicts its flow (a KindUntracked event, no namespace).
	var asked, answers, untracked atomic.Uint64
	ours := map[uint64]bool{} // the answered queries' qids (the reader's)
	ctx, cancel := context.WithCancel(context.Background())
	readDone := make(chan error, 1)
	go func() {
		readDone <- tr.Read(ctx, func(e *event.Event) {
			switch {
			case e.Kind == event.KindUntracked && ours[e.QID]:
				untracked.Add(1)
			case e.NetNS != n.clientIno:
			case e.Kind == event.KindQuery && e.Packet.Dst.Port() == 53:
				asked.Add(1)
				ours[e.QID] = e.Flags&event.FlagUntracked == 0
				if !ours[e.QID] {
					untracked.Add(1)
				}
			case e.Kind == event.KindAnswer && e.QID != 0:
				answers.Add(1)
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
	st0 := tr.Stats()
	refused0 := st0.FlowsRefused
	sendSilent(fill)
	// Flows are inserted in the sender's context, by the send or the
	// first device, so they are all in once the writes returned, less
	// what the sweeper removed meanwhile: where sending is slow (an
	// emulated arm64 sharing the host's cores) a sweep can fall inside
	// the fill and evict down to sweepLow, and a fill that takes longer
	// than maxAge sees its first flows swept.
	st := tr.Stats()
	if h, ev, sw := held(), st.FlowsEvicted-st0.FlowsEvicted, st.FlowsSwept-st0.FlowsSwept; h+int(ev+sw) < entries*3/4 {
		t.Fatalf("after %d unanswered queries the table holds %d of their flows, %d were evicted and %d swept: it has room for %d", fill, h, ev, sw, entries)
	}
	if r := tr.Stats().FlowsRefused - refused0; r == 0 {
		t.Fatalf("%d unanswered queries into a table of %d: none refused", fill, entries)
	}

	conns := make([]*net.UDPConn, sockets)
	for i := range conns {
		conns[i] = n.dial(t, "udp4", answerer, 53)
	}
	// One round: 16 queries on each socket, a burst of unanswered ones,
	// then the 128 answers.
	round := func(r, burst int) {
		for _, conn := range conns {
			for i := range inFlight {
				if _, err := conn.Write(queryWithID(t, uint16(r*inFlight+i))); err != nil {
					t.Fatalf("query: %v", err)
				}
			}
		}
		sendSilent(burst)
		buf := make([]byte, 512)
		for _, conn := range conns {
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			for range inFlight {
				if _, err := conn.Read(buf); err != nil {
					t.Fatalf("answer: %v", err)
				}
			}
		}
	}
	// settled waits until every answered query sent so far is accounted
	// for (answered, or untracked), or reading stalls.
	settled := func(want uint64) {
		// It gives up once nothing more was read for 5 s: a guest
		// sharing its host reads slowly, not never.
		var read uint64
		since := time.Now()
		for asked.Load() < want || answers.Load()+untracked.Load() < asked.Load() {
			if n := asked.Load() + answers.Load() + untracked.Load(); n != read {
				read, since = n, time.Now()
			} else if time.Since(since) > 5*time.Second {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for r := range rounds {
		round(r, burst)
	}
	want := uint64(sockets * inFlight * rounds)
	settled(want)
	st = tr.Stats()
	t.Logf("while full: %d answered queries asked, %d ANSWER records, %d untracked; table: %d refused, %d evicted, %d swept",
		asked.Load(), answers.Load(), untracked.Load(), st.FlowsRefused-refused0, st.FlowsEvicted, st.FlowsSwept)
	if got := asked.Load(); got != want {
		t.Fatalf("%d QUERY records for %d answered queries (%d records lost)", got, want, tr.Lost())
	}
	if a, u := answers.Load(), untracked.Load(); a+u != want {
		t.Errorf("%d ANSWER records and %d untracked queries for %d answered queries: %d lost unnoticed", a, u, want, want-a-u)
	}

	// The sweeper makes room (younger than maxAge, the flows are evicted,
	// not swept), and then every fresh query is tracked and answered.
	// Waited for in sweeps, not seconds: a sweep, and a walk of the table
	// (held), take a second or more where the guest is emulated (arm64),
	// more when other guests share the host's cores.
	ev0 := tr.Stats().FlowsEvicted
	waitSweeps(tr, 3, func() bool { return held() <= entries*3/4 })
	if h, st := held(), tr.Stats(); h > entries*3/4 || st.FlowsEvicted == 0 {
		t.Errorf("the sweeper made no room in a full table: %d flows held, %d evicted (%d since the rounds), %d swept",
			h, st.FlowsEvicted, st.FlowsEvicted-ev0, st.FlowsSwept)
	}
	a0, u0 := answers.Load(), untracked.Load()
	round(rounds, 0)
	settled(want + sockets*inFlight)
	if a, u := answers.Load()-a0, untracked.Load()-u0; a != sockets*inFlight || u != 0 {
		t.Errorf("after the sweeper made room: %d ANSWER records, %d untracked of %d queries, want every one answered", a, u, sockets*inFlight)
	}

	// Nothing asked any more: every flow is swept once older than maxAge.
	time.Sleep(maxAge)
	waitSweeps(tr, 3, func() bool { return held() == 0 })
	if h := held(); h != 0 {
		t.Errorf("%d flows still held FlowMaxAge (%v) and 3 sweeps after the last query", h, maxAge)
	}
	if tr.Stats().FlowsSwept == 0 {
		t.Errorf("no flow swept")
	}
}

// waitSweeps waits until cond holds or tr's sweeper has swept n times
// more (the one under way not counted), for at most a minute (a sweeper
// that stopped).
func waitSweeps(tr *Tracer, n uint64, cond func() bool) {
	until := tr.sweeper.runs.Load() + n + 1
	deadline := time.Now().Add(time.Minute)
	for !cond() && tr.sweeper.runs.Load() < until && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
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
