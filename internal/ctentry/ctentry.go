package ctentry

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/natrules"
)

// Tuple is one direction of a connection.
type Tuple struct {
	Src, Dst netip.AddrPort
	Proto    uint8 // unix.IPPROTO_UDP, _TCP, ...
}

func (t Tuple) String() string {
	return fmt.Sprintf("%s %s -> %s", natrules.ProtoName(t.Proto), t.Src, t.Dst)
}

// Status holds the IPS_* bits of an entry (uapi nf_conntrack_common.h).
type Status uint32

const (
	SeenReply Status = 1 << 1 // IPS_SEEN_REPLY: a packet went the other way
	Assured   Status = 1 << 2 // IPS_ASSURED: early drop spares it
	Confirmed Status = 1 << 3 // IPS_CONFIRMED: in the table
	SrcNAT    Status = 1 << 4 // IPS_SRC_NAT
	DstNAT    Status = 1 << 5 // IPS_DST_NAT: the reply's source is the NAT target
)

// String lists the set bits that matter here: "SEEN_REPLY|ASSURED|DST_NAT".
func (s Status) String() string {
	var parts []string
	for _, b := range []struct {
		bit  Status
		name string
	}{{SeenReply, "SEEN_REPLY"}, {Assured, "ASSURED"}, {Confirmed, "CONFIRMED"}, {SrcNAT, "SRC_NAT"}, {DstNAT, "DST_NAT"}} {
		if s&b.bit != 0 {
			parts = append(parts, b.name)
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "|")
}

// Entry is one conntrack entry.
type Entry struct {
	ID uint32
	// Orig is the tuple of the first packet, before NAT. Reply is what a
	// reply looks like: its source is where the NAT sent the packets (for
	// a DNATed entry, the backend), its destination the SNAT address.
	Orig, Reply Tuple
	Status      Status
	// Timeout is what was left before the kernel expires the entry, at
	// the moment it was read; every packet of the flow sets it back up.
	Timeout time.Duration
	// Start is when the entry was made; zero unless the namespace had the
	// timestamp extension on (net.netfilter.nf_conntrack_timestamp=1)
	// then.
	Start time.Time
	Mark  uint32
	Zone  uint16
}

// DNATTarget is where the entry sends the original direction's packets:
// the reply's source.
func (e Entry) DNATTarget() netip.AddrPort { return e.Reply.Src }

// ErrNotFound: no entry has that original tuple.
var ErrNotFound = errors.New("no conntrack entry")

// Get returns the entry whose original tuple is orig, from the namespace at
// netnsPath ("" = the caller's).
func Get(netnsPath string, orig Tuple) (Entry, error) {
	var e Entry
	err := withConn(netnsPath, func(c *conntrack.Conn) error {
		f, err := c.Get(flowOf(orig))
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("getting conntrack entry %s: %w", orig, ErrNotFound)
			}
			return fmt.Errorf("getting conntrack entry %s: %w", orig, err)
		}
		e = entryOf(f)
		return nil
	})
	return e, err
}

// Dump returns the entries of the namespace at netnsPath ("" = the
// caller's) that keep accepts (every entry when keep is nil), IPv4 and
// IPv6. The kernel sends the whole table; keep only saves memory.
func Dump(netnsPath string, keep func(Entry) bool) ([]Entry, error) {
	var out []Entry
	err := withConn(netnsPath, func(c *conntrack.Conn) error {
		flows, err := c.Dump(nil)
		if err != nil {
			return fmt.Errorf("dumping conntrack entries: %w", err)
		}
		for _, f := range flows {
			e := entryOf(f)
			if keep == nil || keep(e) {
				out = append(out, e)
			}
		}
		return nil
	})
	return out, err
}

// Delete removes the entry whose original tuple is orig. The flow's next
// packet makes a new entry through the NAT rules as they are now.
func Delete(netnsPath string, orig Tuple) error {
	return withConn(netnsPath, func(c *conntrack.Conn) error {
		f, err := c.Get(flowOf(orig))
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("deleting conntrack entry %s: %w", orig, ErrNotFound)
			}
			return fmt.Errorf("deleting conntrack entry %s: %w", orig, err)
		}
		// Both tuples and the ID: the kernel deletes this entry and no
		// other that took its tuple in between.
		del := conntrack.Flow{ID: f.ID, TupleOrig: f.TupleOrig, TupleReply: f.TupleReply, Zone: f.Zone}
		if err := c.Delete(del); err != nil {
			return fmt.Errorf("deleting conntrack entry %s: %w", orig, err)
		}
		return nil
	})
}

func withConn(netnsPath string, fn func(*conntrack.Conn) error) error {
	cfg := &netlink.Config{}
	if netnsPath != "" {
		f, err := os.Open(netnsPath)
		if err != nil {
			return fmt.Errorf("opening network namespace: %w", err)
		}
		defer f.Close()
		cfg.NetNS = int(f.Fd())
	}
	c, err := conntrack.Dial(cfg)
	if err != nil {
		return fmt.Errorf("opening ctnetlink socket: %w", err)
	}
	defer c.Close()
	return fn(c)
}

func flowOf(t Tuple) conntrack.Flow {
	var f conntrack.Flow
	f.TupleOrig.IP.SourceAddress = t.Src.Addr()
	f.TupleOrig.IP.DestinationAddress = t.Dst.Addr()
	f.TupleOrig.Proto.Protocol = t.Proto
	f.TupleOrig.Proto.SourcePort = t.Src.Port()
	f.TupleOrig.Proto.DestinationPort = t.Dst.Port()
	return f
}

func tupleOf(t conntrack.Tuple) Tuple {
	return Tuple{
		Src:   netip.AddrPortFrom(t.IP.SourceAddress, t.Proto.SourcePort),
		Dst:   netip.AddrPortFrom(t.IP.DestinationAddress, t.Proto.DestinationPort),
		Proto: t.Proto.Protocol,
	}
}

func entryOf(f conntrack.Flow) Entry {
	return Entry{
		ID:      f.ID,
		Orig:    tupleOf(f.TupleOrig),
		Reply:   tupleOf(f.TupleReply),
		Status:  Status(f.Status),
		Timeout: time.Duration(f.Timeout) * time.Second,
		Start:   f.Timestamp.Start,
		Mark:    f.Mark,
		Zone:    f.Zone,
	}
}

// DeleteCommand is the command an operator runs to delete the entry with
// original tuple orig in the namespace at netnsPath ("" the caller's): `ip
// netns exec NAME` for an iproute2 name, `nsenter --net=PATH` for any other
// path, then conntrack -D by the original tuple.
func DeleteCommand(netnsPath string, orig Tuple) string {
	var argv []string
	switch dir, name := path.Split(netnsPath); {
	case netnsPath == "":
	case dir == "/run/netns/" || dir == "/var/run/netns/":
		argv = []string{"ip", "netns", "exec", name}
	default:
		argv = []string{"nsenter", "--net=" + netnsPath}
	}
	argv = append(argv, "conntrack", "-D")
	if orig.Src.Addr().Is6() {
		argv = append(argv, "-f", "ipv6")
	}
	proto := "udp"
	if orig.Proto == unix.IPPROTO_TCP {
		proto = "tcp"
	}
	return strings.Join(append(argv, "-p", proto,
		"--orig-src", orig.Src.Addr().String(), "--orig-port-src", strconv.Itoa(int(orig.Src.Port())),
		"--orig-dst", orig.Dst.Addr().String(), "--orig-port-dst", strconv.Itoa(int(orig.Dst.Port()))), " ")
}
