package event

import (
	"fmt"
	"net/netip"
	"strings"
)

// Kind says what a record reports. The kernel side sends a Query when a
// query is first seen, an Answer when its answer reaches the asking
// namespace, and one of the other kinds only when something happens that
// user space must explain; hops that change nothing send nothing.
type Kind uint8

const (
	KindInvalid Kind = iota
	// KindQuery: a DNS query first seen (its send, or the first device or
	// drop hook). Packet is the asking socket's tuple (original
	// direction), DNS its question; QID names it from now on.
	KindQuery
	// KindAnswer: the answer to QID reached the asking namespace (or
	// socket). DNS.Rcode and DNS.Response are set, nothing else of DNS.
	KindAnswer
	// KindDrop: a DNS packet freed by skb:kfree_skb: Reason (0 before
	// 5.17), Location, its entry (CT) and, in the tracepoint tier, the
	// entry that held its tuple (Winner, WinnerQID). FlagResponse marks an
	// answer; an answer no flow expects carries its question in DNS.
	KindDrop
	// KindConfirmDrop: __nf_conntrack_confirm returned NF_DROP for QID's
	// packet (fentry/kprobe); Winner is nf_ct_resolve_clash's, if called.
	KindConfirmDrop
	// KindMerged: the loser CT (QID's, freed: only its address is
	// known) was merged into Winner, the entry its packet carries since
	// confirm (fentry/kprobe: at confirm's return; tracepoint tier: at the
	// next sight after the netfilter program saw the loser's entry).
	KindMerged
	// KindNATClash: the loser CT was inserted reply-only with
	// IPS_NAT_CLASH (kernel >= 5.6); the packet goes on.
	KindNATClash
	// KindCTFreed: an unconfirmed DNS entry (CT) freed without its packet
	// being dropped: a merged loser (tracepoint tier). QID is 0: the
	// entry's original tuple names the socket.
	KindCTFreed
	// KindWinner: the winner of QID's earlier lost race, seen confirmed
	// after the drop (tracepoint tier).
	KindWinner
	// KindRcvbufFull: an answer (to QID when known; else Packet is the
	// socket's tuple) hit a full socket receive buffer.
	KindRcvbufFull
	// KindCTNetNS: the first DNS entry of namespace NetNS: its conntrack
	// counters take part in the reconciliation from now on.
	KindCTNetNS
	// KindUntracked: the kernel's answers table had no room for QID's
	// entry (NAT in its own namespace rewrites its answer): its answer
	// will not be matched.
	KindUntracked
	kindMax
)

var kindNames = [...]string{"invalid", "query", "answer", "drop", "confirm_drop", "merged", "nat_clash",
	"ct_freed", "winner", "rcvbuf_full", "ct_netns", "untracked"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Flags of a record (enum rec_flags).
const (
	// FlagNoSocket: the query was first seen by a netfilter or drop hook,
	// not at a local socket's send (forwarded from outside, or the send
	// hook missed it).
	FlagNoSocket = 1 << 0
	// FlagResponse: the packet is a DNS response.
	FlagResponse = 1 << 1
	// FlagWinner: Winner is set.
	FlagWinner = 1 << 2
	// FlagSender: a query first seen in its sender's own context (PID,
	// Comm and Cgroup are the sender's); a query's drop inside its send
	// (the packet was still its socket's), which a netfilter drop fails
	// with an error the sender sees.
	FlagSender = 1 << 3
	// FlagAtDrop: a query first seen at its own drop (NAT in its own
	// namespace dropped it, or a copy of another query after NAT that no
	// earlier hop carried: a bridge flooded it).
	FlagAtDrop = 1 << 4
	// FlagUntracked: a query the kernel's flow table had no room for: its
	// answer will not be matched.
	FlagUntracked = 1 << 5
)

// Tier is the kind of BPF program that produced an event.
type Tier uint8

const (
	TierNone Tier = iota
	TierTracepoint
	TierKprobe
	TierFentry
)

var tierNames = [...]string{"none", "tracepoint", "kprobe", "fentry"}

func (t Tier) String() string {
	if int(t) < len(tierNames) {
		return tierNames[t]
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// ParseTier maps a --attach value to a Tier.
func ParseTier(s string) (Tier, error) {
	for i, n := range tierNames {
		if n == s && i != int(TierNone) {
			return Tier(i), nil
		}
	}
	return TierNone, fmt.Errorf("unknown attach tier %q (want fentry, kprobe or tracepoint)", s)
}

// Tuple is one direction of a UDP flow.
type Tuple struct {
	Src, Dst netip.AddrPort
	Proto    uint8
}

func (t Tuple) IsValid() bool { return t.Src.IsValid() && t.Dst.IsValid() }

func (t Tuple) String() string {
	if !t.IsValid() {
		return "-"
	}
	return t.Src.String() + "->" + t.Dst.String()
}

// Conntrack status bits (include/uapi/linux/netfilter/
// nf_conntrack_common.h) that user space reads (CT.Confirmed) or its tests
// set. The kernel side reads IPS_NAT_CLASH itself (bpf/lib/conntrack.h).
const (
	IPSSeenReply = 1 << 1
	IPSConfirmed = 1 << 3
	IPSDstNAT    = 1 << 5
)

// CT is a conntrack entry as seen from BPF.
type CT struct {
	Ptr    uint64 // nf_conn address: identity, never dereferenced here
	Status uint32
	Orig   Tuple
	Reply  Tuple
}

func (c CT) Confirmed() bool { return c.Status&IPSConfirmed != 0 }

// Answered: the entry has seen a packet in the reply direction, so it
// was made before the packet that carries it now, by an earlier one.
func (c CT) Answered() bool { return c.Status&IPSSeenReply != 0 }

// DNATed: the entry sends its original destination elsewhere.
func (c CT) DNATed() bool { return c.Status&IPSDstNAT != 0 || c.Reply.Src != c.Orig.Dst }

// MaxName bounds the question name's dotted form (QName, NameBytes); a
// longer name is shown cut and NameTruncated is set. The name as sent
// (Name, NameKey) is kept whole.
const MaxName = 128

// maxWire is the most bytes of labels a question name has here (at most
// 255: decodeDNS's bound, and gopacket's).
const maxWire = 255

// DNS is the header and first question of the DNS message in a packet.
// The question name is kept as its labels came on the wire and shown in
// dotted form only when asked for (QName, NameBytes): following a query
// needs only its hash (NameKey), and a node asks for few distinct names, so
// most queries' names are never converted.
type DNS struct {
	Valid         bool
	ID            uint16
	Response      bool
	Rcode         uint8
	QType         uint16
	NameLen       uint8 // of the dotted form
	NameTruncated bool
	wireLen       uint8             // bytes of labels in wire, without the root label
	whole         bool              // wire[wireLen] is the root label: the name was traced to its end
	shown         bool              // name holds the dotted form of wire
	wire          [maxWire + 1]byte // the name as sent, as far as it was traced
	name          [MaxName]byte     // dotted form, no trailing dot
}

// QName returns the question name ("." for the root). It allocates; the hot
// path keys names by NameKey instead.
func (d *DNS) QName() string {
	if d.NameLen == 0 {
		return "."
	}
	return string(d.NameBytes())
}

// SetQName stores name (dotted form), cutting its dotted form at MaxName
// bytes; its labels become the wire form, so NameKey and Name are what a
// decoded message with that name gives. The wire form stops before an
// empty label, one past 63 bytes or one past 255 bytes of labels; Name then
// reports the name cut there.
func (d *DNS) SetQName(name string) {
	n := copy(d.name[:], name)
	d.NameLen, d.NameTruncated, d.shown = uint8(n), n < len(name), true
	w, whole := 0, true
	for name != "" {
		label := name
		if i := strings.IndexByte(name, '.'); i >= 0 {
			label, name = name[:i], name[i+1:]
		} else {
			name = ""
		}
		if label == "" || len(label) > 63 || w+1+len(label) > maxWire {
			whole = false
			break
		}
		d.wire[w] = byte(len(label))
		w += 1 + copy(d.wire[w+1:], label)
	}
	d.wire[w] = 0
	d.wireLen, d.whole = uint8(w), whole
}

// NameBytes returns the name in dotted form (empty for the root), valid
// until d changes.
func (d *DNS) NameBytes() []byte {
	if !d.shown {
		d.show()
	}
	return d.name[:d.NameLen]
}

// NameKey returns the name's labels as the message had them (without the
// root label): the same bytes for the same name, for hashing. Valid until d
// changes.
func (d *DNS) NameKey() []byte { return d.wire[:d.wireLen] }

// Name returns the question name as the message carried it, as far as the
// record held it: the zero Name when it held none, and a name that is not
// Valid reads as cut before its first label of a reserved type, or the
// label that took it past 255 bytes. It allocates: it is for keeping a
// name, not for the hot path.
func (d *DNS) Name() Name {
	n := int(d.wireLen)
	if d.whole {
		n++
	}
	return Name{string(d.wire[:n])}
}

// Name is a question name as the query carried it on the wire: its labels
// (a length byte, then that many bytes, no compression pointers) and, when
// the traced bytes held the whole name, the root label's zero byte. The
// kernel copies at most RawDNSCap bytes of a message, and fewer when the
// packet's first segment is shorter, so a name can be cut (Cut): it then
// ends without the root label, perhaps inside a label, and the labels after
// the cut are not known. The zero Name is a name of which nothing was
// traced. Names compare with ==.
type Name struct{ wire string }

// Wire returns the name's bytes as traced: every label traced, the last
// perhaps cut (Cut), and the root label when the name was traced to its
// end.
func (n Name) Wire() string { return n.wire }

// Labels returns the labels traced whole, in wire form, without the root
// label: all of them unless the name is cut, and then those before the
// label the trace ended inside (all the traced ones, if it ended between
// two labels).
func (n Name) Labels() string {
	end, _ := n.split()
	return n.wire[:end]
}

// Cut reports whether the traced bytes ended before the name did.
func (n Name) Cut() bool {
	_, whole := n.split()
	return !whole
}

// split returns where the labels traced whole end in n.wire and whether
// the root label follows them.
func (n Name) split() (end int, whole bool) {
	w := n.wire
	off := 0
	for off < len(w) {
		l := int(w[off])
		if l == 0 {
			return off, true
		}
		if off+1+l > len(w) {
			break
		}
		off += 1 + l
	}
	return off, false
}

// String returns the name's dotted form as DNS.QName shows it: "." for
// the root (and for a name of which nothing was traced), bytes outside
// printable ASCII and dots inside a label as '?', cut at MaxName bytes.
func (n Name) String() string {
	var b [MaxName]byte
	if l := showName(&b, n.wire); l > 0 {
		return string(b[:l])
	}
	return "."
}

// Event is one record. Fields a record does not carry stay zero.
type Event struct {
	Kind   Kind
	Tier   Tier
	Flags  uint8
	TimeNs uint64 // CLOCK_MONOTONIC, bpf_ktime_get_ns
	CPU    uint16
	NetNS  uint32 // inode of the network namespace the hook ran in
	QID    uint64 // the query this is about; 0 unknown

	// Query: the process that sent it (when the hook ran in its context).
	PID    uint32
	Comm   [16]byte
	Cgroup uint64 // cgroup v2 id of current

	// Query: the asking socket's tuple; other kinds: the packet's header.
	Packet Tuple
	DNS    DNS

	CT        CT     // the packet's entry (the loser, for a race)
	Winner    CT     // the entry already in the table (FlagWinner)
	WinnerQID uint64 // the winner's query, when the kernel side knew it
	Reason    uint32 // Drop: enum skb_drop_reason value (0 before 5.17)
	Location  uint64 // Drop: address that freed the skb
}

// reset zeroes every field of e but the DNS name's two buffers (wire and
// name), which are read only as far as their lengths say: they are 384 of
// the Event's 880 bytes, and zeroing them was most of what an answer
// record's decode cost. TestResetZeroesEveryField holds this list to the
// struct.
func (e *Event) reset() {
	e.Kind, e.Tier, e.Flags, e.TimeNs, e.CPU, e.NetNS, e.QID = 0, 0, 0, 0, 0, 0, 0
	e.PID, e.Comm, e.Cgroup = 0, [16]byte{}, 0
	e.Packet = Tuple{}
	d := &e.DNS
	d.Valid, d.ID, d.Response, d.Rcode, d.QType, d.NameLen, d.NameTruncated = false, 0, false, 0, 0, 0, false
	d.wireLen, d.whole, d.shown = 0, false, false
	e.CT, e.Winner = CT{}, CT{}
	e.WinnerQID, e.Reason, e.Location = 0, 0, 0
}

// Response reports whether the record's packet is a DNS response.
func (e *Event) Response() bool { return e.Flags&FlagResponse != 0 }

// CommString returns a process name as the kernel keeps it (Event.Comm:
// NUL-padded, unterminated at 16 bytes) up to its first NUL.
func CommString(comm [16]byte) string {
	for i, c := range comm {
		if c == 0 {
			return string(comm[:i])
		}
	}
	return string(comm[:])
}

// Indexes of the kernel side's per-CPU counters (enum stat_index).
const (
	// StatRingLost: records the ring buffer had no room for.
	StatRingLost = 0
	// StatFlowsNew: queries first seen (flows started).
	StatFlowsNew = 1
	// StatFlowsAnswered: flows ended because their answer arrived.
	StatFlowsAnswered = 2
	// StatFlowsRefused: flows (and answers entries) a full table had no
	// room for; their queries are untracked.
	StatFlowsRefused = 3
	StatMax          = 4
)
