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
	kindMax
)

var kindNames = [...]string{"invalid", "query", "answer", "drop", "confirm_drop", "merged", "nat_clash",
	"ct_freed", "winner", "rcvbuf_full", "ct_netns"}

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

// Reverse returns the tuple of the other direction.
func (t Tuple) Reverse() Tuple { return Tuple{Src: t.Dst, Dst: t.Src, Proto: t.Proto} }

// Conntrack status bits dnsrace looks at (include/uapi/linux/netfilter/
// nf_conntrack_common.h).
const (
	IPSConfirmed    = 1 << 3
	IPSSrcNAT       = 1 << 4
	IPSDstNAT       = 1 << 5
	IPSFixedTimeout = 1 << 10
	// IPSNATClash is the kernel-only alias of IPS_UNTRACKED (bit 12) that
	// nf_ct_resolve_clash_harder sets on a loser it inserted reply-only
	// (kernel >= 5.6, commit 6a757c07e51f).
	IPSNATClash = 1 << 12
)

// CT is a conntrack entry as seen from BPF.
type CT struct {
	Ptr    uint64 // nf_conn address: identity, never dereferenced here
	Status uint32
	Orig   Tuple
	Reply  Tuple
}

func (c CT) Confirmed() bool { return c.Status&IPSConfirmed != 0 }

// MaxName bounds the question name kept per event; longer names are cut and
// NameTruncated is set.
const MaxName = 128

// DNS is the header and first question of the DNS message in a packet.
// The question name is kept as its labels came on the wire and shown in
// dotted form only when asked for (QName, NameBytes): following a query
// needs only its hash (NameKey), and a node asks for few distinct names, so
// most queries' names are never converted (that was a quarter of the read
// path's instructions).
type DNS struct {
	Valid         bool
	ID            uint16
	Response      bool
	Rcode         uint8
	QType         uint16
	NameLen       uint8 // of the dotted form
	NameTruncated bool
	wireLen       uint8
	shown         bool              // name holds the dotted form of wire
	wire          [MaxName + 1]byte // the name's first labels as sent: all the dotted form needs
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

// SetQName stores name (dotted form), cutting it at MaxName bytes; its
// labels become the wire form, so NameKey is what a decoded message with
// that name gives.
func (d *DNS) SetQName(name string) {
	n := copy(d.name[:], name)
	d.NameLen, d.NameTruncated, d.shown = uint8(n), n < len(name), true
	w := 0
	for name != "" && w < len(d.wire) {
		label := name
		if i := strings.IndexByte(name, '.'); i >= 0 {
			label, name = name[:i], name[i+1:]
		} else {
			name = ""
		}
		if label == "" || len(label) > 63 {
			break
		}
		d.wire[w] = byte(len(label))
		w += 1 + copy(d.wire[w+1:], label)
	}
	d.wireLen = uint8(w)
}

// NameBytes returns the name in dotted form (empty for the root), valid
// until d changes.
func (d *DNS) NameBytes() []byte {
	if !d.shown {
		d.show()
	}
	return d.name[:d.NameLen]
}

// NameKey returns the name's labels as the message had them, as far as
// its dotted form is kept (MaxName): the same bytes for the same name, for
// hashing. Valid until d changes.
func (d *DNS) NameKey() []byte { return d.wire[:d.wireLen] }

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

// Response reports whether the record's packet is a DNS response.
func (e *Event) Response() bool { return e.Flags&FlagResponse != 0 }

// CommString returns Comm up to its first NUL.
func (e *Event) CommString() string {
	for i, c := range e.Comm {
		if c == 0 {
			return string(e.Comm[:i])
		}
	}
	return string(e.Comm[:])
}

// Indexes of the kernel side's per-CPU counters (enum dnsrace_stat).
const (
	// StatRingLost: records the ring buffer had no room for.
	StatRingLost = 0
	// StatFlowsNew: queries first seen (flows started).
	StatFlowsNew = 1
	// StatFlowsAnswered: flows ended because their answer arrived.
	StatFlowsAnswered = 2
	StatMax           = 3
)
