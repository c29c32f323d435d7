package lab

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/ti-mo/conntrack"

	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// UDPCounters are a namespace's UDP SNMP counters (/proc/net/snmp).
type UDPCounters struct {
	NoPorts      uint64 `json:"no_ports"`
	InErrors     uint64 `json:"in_errors"`
	RcvbufErrors uint64 `json:"rcvbuf_errors"`
}

func (u UDPCounters) sub(o UDPCounters) UDPCounters {
	return UDPCounters{u.NoPorts - o.NoPorts, u.InErrors - o.InErrors, u.RcvbufErrors - o.RcvbufErrors}
}

// readUDPCounters reads /proc/net/snmp of namespace ns. It must go through
// thread-self: /proc/self/net is the namespace of the process's main
// thread, not of the thread that entered ns.
func readUDPCounters(ns string) (UDPCounters, error) {
	var u UDPCounters
	var raw []byte
	err := nsutil.Do(ns, func() (err error) {
		raw, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	})
	if err != nil {
		return u, fmt.Errorf("reading UDP counters of %s: %w", ns, err)
	}
	return parseSNMPUdp(raw)
}

func parseSNMPUdp(raw []byte) (UDPCounters, error) {
	var u UDPCounters
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = f[1:]
			continue
		}
		for i, v := range f[1:] {
			if i >= len(names) {
				break
			}
			n, _ := strconv.ParseUint(v, 10, 64)
			switch names[i] {
			case "NoPorts":
				u.NoPorts = n
			case "InErrors":
				u.InErrors = n
			case "RcvbufErrors":
				u.RcvbufErrors = n
			}
		}
		return u, nil
	}
	return u, errors.New("no Udp: lines in /proc/net/snmp")
}

// snapshot is every ground-truth counter at one instant.
type snapshot struct {
	ct      []ctstats.Snapshot // one per NAT namespace, in natReaders order
	nodeUDP UDPCounters
	podUDP  UDPCounters
	sent    uint64
	answers uint64
}

// natReaders reads the conntrack counters of every namespace the lab's NAT
// rules drive.
type natReaders struct {
	names   []string
	inodes  []uint32
	readers []*ctstats.Reader
}

func openNATReaders(t Topology) (*natReaders, error) {
	n := &natReaders{}
	for _, name := range t.NATNamespaces() {
		r, err := ctstats.Open(nsutil.Path(name))
		if err != nil {
			n.close()
			return nil, err
		}
		ino, err := nsutil.Inode(name)
		if err != nil {
			r.Close()
			n.close()
			return nil, err
		}
		n.names, n.inodes, n.readers = append(n.names, name), append(n.inodes, ino), append(n.readers, r)
	}
	return n, nil
}

func (n *natReaders) close() {
	for _, r := range n.readers {
		r.Close()
	}
}

func takeSnapshot(t Topology, ct *natReaders) (snapshot, error) {
	var s snapshot
	var err error
	for _, r := range ct.readers {
		cs, err := r.Read()
		if err != nil {
			return s, err
		}
		s.ct = append(s.ct, cs)
	}
	if s.nodeUDP, err = readUDPCounters(t.NodeNS()); err != nil {
		return s, err
	}
	for i := 0; i < t.Pods; i++ {
		u, err := readUDPCounters(t.PodNS(i))
		if err != nil {
			return s, err
		}
		s.podUDP.NoPorts += u.NoPorts
		s.podUDP.InErrors += u.InErrors
		s.podUDP.RcvbufErrors += u.RcvbufErrors
		sent, answers, err := podCounters(t.PodNS(i))
		if err != nil {
			return s, err
		}
		s.sent += sent
		s.answers += answers
	}
	return s, nil
}

// fillTable fills the node's conntrack table up to nf_conntrack_max with
// assured UDP entries that neither early_drop nor the GC may evict, so every
// new flow in the node is refused as on a node whose table is full.
// ctnetlink refuses to set ASSURED unless CONFIRMED is in the same status
// word (EBUSY), so the entries are created with all three bits.
// nf_conntrack_max is global and read-only inside a namespace; filling the
// node's own table leaves the host alone. It returns the entries added.
func fillTable(t Topology) (int, error) {
	f, err := os.Open(nsutil.Path(t.NodeNS()))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	c, err := conntrack.Dial(netlinkConfig(int(f.Fd())))
	if err != nil {
		return 0, fmt.Errorf("opening ctnetlink in %s: %w", t.NodeNS(), err)
	}
	defer c.Close()
	st, err := ctstats.Read(nsutil.Path(t.NodeNS()))
	if err != nil {
		return 0, err
	}
	if st.Max == 0 {
		return 0, errors.New("nf_conntrack_max is 0 (unlimited): a table cannot be filled")
	}
	added := 0
	dst := netip.MustParseAddr("10.251.0.1")
	for n := int(st.Entries); n < int(st.Max)+1; n++ {
		src := netip.AddrFrom4([4]byte{10, 250, byte(added >> 16), byte(added >> 8)})
		flow := conntrack.NewFlow(17, conntrack.StatusAssured|conntrack.StatusSeenReply|conntrack.StatusConfirmed, src, dst,
			uint16(1024+added&0xff), 9, 3600, 0)
		if err := c.Create(flow); err != nil {
			// The table refuses the entry that would pass the limit.
			if added > 0 {
				return added, nil
			}
			return 0, fmt.Errorf("filling conntrack table: %w", err)
		}
		added++
	}
	return added, nil
}
