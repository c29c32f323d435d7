package event

import (
	"fmt"
	"net/netip"
)

// Kind says which hook produced an event.
type Kind uint8

const (
	KindInvalid Kind = iota
	// KindSend: a DNS datagram handed to udp_sendmsg/udpv6_sendmsg
	// (fentry/kprobe tiers). Packet holds the socket's 5-tuple.
	KindSend
	// KindXmit: a DNS packet queued on a device (net:net_dev_queue). In the
	// tracepoint tier this is where a pod's query is first seen (its veth).
	KindXmit
	// KindRecv: a DNS packet received by a device (net:netif_receive_skb).
	KindRecv
	// KindDeliver: a DNS datagram copied to a socket
	// (skb:skb_copy_datagram_iovec): the answer reached the resolver.
	KindDeliver
	// KindDrop: a DNS packet freed with a drop reason (skb:kfree_skb).
	KindDrop
	// KindConfirm: __nf_conntrack_confirm returned for a DNS packet
	// (fexit/kretprobe tiers). Verdict, CT (entry) and CTAfter are set.
	KindConfirm
	// KindClash: nf_ct_resolve_clash was entered; Winner is the entry that
	// was already in the table (fentry/kprobe tiers).
	KindClash
	// KindCTFree: an unconfirmed conntrack entry of a DNS flow was freed
	// (kmem:kmem_cache_free on the nf_conntrack cache): the loser of a
	// merged clash, or the entry of a packet dropped before confirm.
	KindCTFree
	// KindRcvbufFull: udp:udp_fail_queue_rcv_skb, the socket's receive
	// buffer was full.
	KindRcvbufFull
	kindMax
)

var kindNames = [...]string{"invalid", "send", "xmit", "recv", "deliver", "drop", "confirm", "clash", "ct_free", "rcvbuf_full"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

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
type DNS struct {
	Valid         bool
	ID            uint16
	Response      bool
	Rcode         uint8
	QType         uint16
	NameLen       uint8
	NameTruncated bool
	name          [MaxName]byte // dotted form, no trailing dot
}

// QName returns the question name ("." for the root). It allocates; the hot
// path compares names with SameName instead.
func (d *DNS) QName() string {
	if d.NameLen == 0 {
		return "."
	}
	return string(d.name[:d.NameLen])
}

// SetQName stores name (dotted form), cutting it at MaxName bytes.
func (d *DNS) SetQName(name string) {
	n := copy(d.name[:], name)
	d.NameLen = uint8(n)
	d.NameTruncated = n < len(name)
}

// NameBytes returns the stored name without copying.
func (d *DNS) NameBytes() []byte { return d.name[:d.NameLen] }

// Event is one hook hit. Fields a hook cannot know stay zero.
type Event struct {
	Kind    Kind
	Tier    Tier
	TimeNs  uint64 // CLOCK_MONOTONIC, bpf_ktime_get_ns
	CPU     uint16
	NetNS   uint32 // inode of the network namespace the hook ran in
	Ifindex uint32
	PID     uint32 // tgid of current, when the hook runs in process context
	Comm    [16]byte
	Cgroup  uint64 // cgroup v2 id of current

	Skb    uint64 // sk_buff address: joins events of one packet
	Packet Tuple  // from the packet's IP/UDP headers (Send: the socket's)
	DNS    DNS

	CT       CT     // skb's conntrack entry at the hook (Confirm: at entry)
	CTAfter  uint64 // Confirm: skb's entry on return (differs after a merge)
	Verdict  int32  // Confirm: 1 NF_ACCEPT, 0 NF_DROP; -1 elsewhere
	Winner   CT     // Clash: the entry already in the table
	Reason   uint32 // Drop: enum skb_drop_reason value
	Location uint64 // Drop: address that freed the skb
}

// CommString returns Comm up to its first NUL.
func (e *Event) CommString() string {
	for i, c := range e.Comm {
		if c == 0 {
			return string(e.Comm[:i])
		}
	}
	return string(e.Comm[:])
}
