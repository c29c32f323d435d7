package ctstats

import (
	"fmt"
	"os"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"
)

// Counters are one CPU's conntrack statistics, or their sum.
type Counters struct {
	Found         uint64 `json:"found"`
	Invalid       uint64 `json:"invalid"`
	Insert        uint64 `json:"insert"`
	InsertFailed  uint64 `json:"insert_failed"`
	Drop          uint64 `json:"drop"`
	EarlyDrop     uint64 `json:"early_drop"`
	Error         uint64 `json:"error"`
	SearchRestart uint64 `json:"search_restart"`
	ClashResolve  uint64 `json:"clash_resolve"`
	ChainTooLong  uint64 `json:"chaintoolong"`
}

// Snapshot is one reading of a namespace's counters.
type Snapshot struct {
	PerCPU  []Counters // indexed by CPU id
	Total   Counters
	Entries uint32 // nf_conntrack_count of the namespace
	Max     uint32 // nf_conntrack_max (global)
}

// Sub returns c - prev, field by field. The kernel's counters are unsigned
// 32-bit values read from per-CPU u32s, so a wrap shows as a huge delta; a
// run of dnsrace is far shorter than a wrap.
func (c Counters) Sub(prev Counters) Counters {
	return Counters{
		Found:         c.Found - prev.Found,
		Invalid:       c.Invalid - prev.Invalid,
		Insert:        c.Insert - prev.Insert,
		InsertFailed:  c.InsertFailed - prev.InsertFailed,
		Drop:          c.Drop - prev.Drop,
		EarlyDrop:     c.EarlyDrop - prev.EarlyDrop,
		Error:         c.Error - prev.Error,
		SearchRestart: c.SearchRestart - prev.SearchRestart,
		ClashResolve:  c.ClashResolve - prev.ClashResolve,
		ChainTooLong:  c.ChainTooLong - prev.ChainTooLong,
	}
}

// Add adds o to c, field by field.
func (c *Counters) Add(o Counters) {
	c.Found += o.Found
	c.Invalid += o.Invalid
	c.Insert += o.Insert
	c.InsertFailed += o.InsertFailed
	c.Drop += o.Drop
	c.EarlyDrop += o.EarlyDrop
	c.Error += o.Error
	c.SearchRestart += o.SearchRestart
	c.ClashResolve += o.ClashResolve
	c.ChainTooLong += o.ChainTooLong
}

// ctnetlink message types and attributes (include/uapi/linux/netfilter/
// nfnetlink_conntrack.h).
const (
	msgGetStatsCPU = 4
	msgGetStats    = 5

	attrFound         = 2
	attrInvalid       = 4
	attrInsert        = 8
	attrInsertFailed  = 9
	attrDrop          = 10
	attrEarlyDrop     = 11
	attrError         = 12
	attrSearchRestart = 13
	attrClashResolve  = 14
	attrChainTooLong  = 15

	attrGlobalEntries    = 1
	attrGlobalMaxEntries = 2
)

// Reader reads the counters of one namespace. It keeps its netlink socket,
// which stays bound to the namespace it was opened in and holds it alive:
// a namespace everything else has let go of lives on (with its interfaces)
// until the Reader is closed.
type Reader struct {
	conn *netfilter.Conn
}

// Open returns a Reader for the network namespace at netnsPath (a
// /run/netns/NAME or /proc/PID/ns/net path); "" means the caller's own.
func Open(netnsPath string) (*Reader, error) {
	if netnsPath == "" {
		return dial(&netlink.Config{})
	}
	return OpenInode(netnsPath, 0)
}

// OpenInode is Open of the namespace at path, checked to be the one with
// inode ino (0: any): a path found earlier may name another namespace by
// now (a process gone and its PID reused, a name pointed elsewhere), and
// its counters must not pass for the first one's.
func OpenInode(path string, ino uint32) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening network namespace: %w", err)
	}
	defer f.Close()
	if ino != 0 {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			return nil, fmt.Errorf("opening network namespace: %w", err)
		}
		if uint32(st.Ino) != ino {
			return nil, fmt.Errorf("opening network namespace %d: %s is namespace %d now", ino, path, st.Ino)
		}
	}
	return dial(&netlink.Config{NetNS: int(f.Fd())})
}

func dial(cfg *netlink.Config) (*Reader, error) {
	c, err := netfilter.Dial(cfg)
	if err != nil {
		return nil, fmt.Errorf("opening ctnetlink socket: %w", err)
	}
	return &Reader{conn: c}, nil
}

// Close releases the netlink socket.
func (r *Reader) Close() error { return r.conn.Close() }

// Read takes one snapshot.
func (r *Reader) Read() (Snapshot, error) {
	var s Snapshot
	msgs, err := r.query(msgGetStatsCPU, netlink.Request|netlink.Dump)
	if err != nil {
		return s, fmt.Errorf("dumping per-CPU conntrack statistics: %w", err)
	}
	for _, m := range msgs {
		h, attrs, err := netfilter.UnmarshalNetlink(m)
		if err != nil {
			return s, fmt.Errorf("decoding per-CPU conntrack statistics: %w", err)
		}
		cpu := int(h.ResourceID)
		for len(s.PerCPU) <= cpu {
			s.PerCPU = append(s.PerCPU, Counters{})
		}
		s.PerCPU[cpu] = decodeCounters(attrs)
		s.Total.Add(s.PerCPU[cpu])
	}
	msgs, err = r.query(msgGetStats, netlink.Request|netlink.Dump|netlink.Acknowledge)
	if err != nil {
		return s, fmt.Errorf("reading global conntrack statistics: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type != netlink.HeaderType(uint16(netfilter.NFSubsysCTNetlink)<<8|msgGetStats) {
			continue // the acknowledgement
		}
		_, attrs, err := netfilter.UnmarshalNetlink(m)
		if err != nil {
			return s, fmt.Errorf("decoding global conntrack statistics: %w", err)
		}
		for _, a := range attrs {
			switch a.Type {
			case attrGlobalEntries:
				s.Entries = a.Uint32()
			case attrGlobalMaxEntries:
				s.Max = a.Uint32()
			}
		}
	}
	return s, nil
}

func (r *Reader) query(typ netfilter.MessageType, flags netlink.HeaderFlags) ([]netlink.Message, error) {
	req, err := netfilter.MarshalNetlink(netfilter.Header{
		SubsystemID: netfilter.NFSubsysCTNetlink,
		MessageType: typ,
		Family:      netfilter.ProtoUnspec,
		Flags:       flags,
	}, nil)
	if err != nil {
		return nil, err
	}
	return r.conn.Query(req)
}

func decodeCounters(attrs []netfilter.Attribute) Counters {
	var c Counters
	for _, a := range attrs {
		if len(a.Data) != 4 {
			continue
		}
		v := uint64(a.Uint32())
		switch a.Type {
		case attrFound:
			c.Found = v
		case attrInvalid:
			c.Invalid = v
		case attrInsert:
			c.Insert = v
		case attrInsertFailed:
			c.InsertFailed = v
		case attrDrop:
			c.Drop = v
		case attrEarlyDrop:
			c.EarlyDrop = v
		case attrError:
			c.Error = v
		case attrSearchRestart:
			c.SearchRestart = v
		case attrClashResolve:
			c.ClashResolve = v
		case attrChainTooLong:
			c.ChainTooLong = v
		}
	}
	return c
}

// Read opens netnsPath, takes one snapshot and closes it again.
func Read(netnsPath string) (Snapshot, error) {
	r, err := Open(netnsPath)
	if err != nil {
		return Snapshot{}, err
	}
	defer r.Close()
	return r.Read()
}
