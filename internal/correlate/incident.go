package correlate

import (
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/event"
)

// Causes, stable names used in text and JSON output.
const (
	CauseInsertRace     = "insert_race"
	CauseClashResolved  = "clash_resolved"
	CauseTableFull      = "table_full"
	CauseRuleDrop       = "rule_drop"
	CauseReplyUnmatched = "reply_unmatched"
	CauseRcvbufFull     = "rcvbuf_full"
	CauseNoReply        = "no_reply"
	// CauseLocalDrop: dropped on the node for another reason (the drop
	// reason says which).
	CauseLocalDrop = "local_drop"
	// CauseUpstreamLost: a local forwarder's query for the question was
	// lost; the client waited on it (Incident.Upstream).
	CauseUpstreamLost = "upstream_lost"
	// CauseLateAnswer: answered, but only after Config.LateAnswer, with
	// no loss on the node to explain it.
	CauseLateAnswer = "late_answer"
	// CauseStaleNAT: a conntrack entry made by an earlier query kept
	// sending the socket's query to a NAT target that is gone
	// (Incident.StaleNAT).
	CauseStaleNAT = "stale_nat"
)

// Causes lists every cause in a fixed order (for summaries and metrics).
var Causes = []string{CauseInsertRace, CauseClashResolved, CauseTableFull, CauseRuleDrop,
	CauseReplyUnmatched, CauseRcvbufFull, CauseNoReply, CauseLocalDrop, CauseUpstreamLost, CauseLateAnswer, CauseStaleNAT}

// Races.
const (
	RaceSameTuple  = "same_tuple"
	RaceReplyClash = "reply_clash"
)

// QType is a DNS query type. It stays a number inside; it becomes its
// mnemonic ("AAAA", or "TYPE65280" per RFC 3597 when it has none) only
// where it is written.
type QType uint16

func (t QType) String() string {
	if s, ok := dns.TypeToString[uint16(t)]; ok {
		return s
	}
	return "TYPE" + strconv.Itoa(int(t))
}

// MarshalText writes the mnemonic (JSON).
func (t QType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalText reads a mnemonic or "TYPEn".
func (t *QType) UnmarshalText(b []byte) error {
	s := string(b)
	if v, ok := dns.StringToType[s]; ok {
		*t = QType(v)
		return nil
	}
	if len(s) > 4 && s[:4] == "TYPE" {
		if v, err := strconv.ParseUint(s[4:], 10, 16); err == nil {
			*t = QType(v)
			return nil
		}
	}
	return &strconv.NumError{Func: "QType", Num: s, Err: strconv.ErrSyntax}
}

// Flow is one conntrack entry's tuples.
type Flow struct {
	Src      netip.AddrPort `json:"src"`
	Dst      netip.AddrPort `json:"dst"`
	ReplySrc netip.AddrPort `json:"reply_src,omitzero"`
	ReplyDst netip.AddrPort `json:"reply_dst,omitzero"`
	// The query that created the entry, when the tracer saw it.
	NetNS uint32 `json:"netns,omitempty"`
	QName string `json:"qname,omitempty"`
	QType QType  `json:"qtype,omitzero"`
	Comm  string `json:"comm,omitempty"`
	PID   uint32 `json:"pid,omitempty"`
}

// Packet is one lost DNS query (or its lost answer) of an incident.
type Packet struct {
	QType    QType  `json:"qtype"`
	ID       uint16 `json:"id"`
	Cause    string `json:"cause"`
	Race     string `json:"race,omitempty"`
	Reason   string `json:"reason,omitempty"`   // skb drop reason; none before 5.17
	Location string `json:"location,omitempty"` // where the skb was freed
	NetNS    uint32 `json:"netns,omitempty"`    // namespace of the drop
	CPU      uint16 `json:"cpu"`
	// SendFailed: dropped inside its send, which returned the error to
	// the sender (a netfilter drop in the sender's own namespace).
	SendFailed bool `json:"send_failed,omitempty"`
	// AnsweredMs: it was answered, this long after it was sent (a late
	// answer); null for one never answered.
	AnsweredMs *float64 `json:"answered_ms,omitempty"`
	SentNs     uint64   `json:"-"`
}

// Dropped reports whether the packet was freed on this node (a drop record:
// a location, and a reason from 5.17 on), not just never answered.
func (p *Packet) Dropped() bool { return p.Reason != "" || p.Location != "" }

// DropSite says where the packet was dropped, for the writers:
// "NETFILTER_DROP at nf_hook_slow+0x7d in netns N", without the reason where
// the kernel gives none (before 5.17) and without the location where none
// was read.
func (p *Packet) DropSite() string {
	s := "in netns " + strconv.FormatUint(uint64(p.NetNS), 10)
	if p.Location != "" {
		s = "at " + p.Location + " " + s
	}
	if p.Reason != "" {
		s = p.Reason + " " + s
	}
	return s
}

// Sibling is the other query of an A/AAAA pair sent on the same 5-tuple.
type Sibling struct {
	QType    QType   `json:"qtype"`
	ID       uint16  `json:"id"`
	GapUs    float64 `json:"gap_us"` // send time difference
	CPUs     [2]int  `json:"cpus"`   // CPU of the lost query, of the sibling
	Answered bool    `json:"answered"`
	Lost     bool    `json:"lost"`
}

// Retry is the query that ended a stall: the resolver's resend, from the
// same socket or a new one.
type Retry struct {
	QType QType          `json:"qtype"`
	ID    uint16         `json:"id"`
	Src   netip.AddrPort `json:"src"`
	Dst   netip.AddrPort `json:"dst"`
}

// Incident is one lookup that waited out one or more resolver timeouts:
// the lost queries of all its attempts, its cause the first lost query's
// (each lost packet has its own). Or one race the kernel rescued, cause
// clash_resolved, with no stall.
type Incident struct {
	Type  string    `json:"type"` // "incident"
	ID    uint64    `json:"id"`
	Time  time.Time `json:"time"` // when the first lost query was sent
	Cause string    `json:"cause"`
	Race  *string   `json:"race"`
	QName string    `json:"qname"`
	// Name is the question name as the query carried it (QName is its
	// shown form); not in JSON.
	Name    event.Name     `json:"-"`
	QType   QType          `json:"qtype"`
	NetNS   uint32         `json:"netns"`
	PID     uint32         `json:"pid,omitempty"`
	Comm    string         `json:"comm,omitempty"`
	Cgroup  uint64         `json:"cgroup,omitempty"`
	Src     netip.AddrPort `json:"src"`
	Dst     netip.AddrPort `json:"dst"`
	StallMs *float64       `json:"stall_ms"`
	// StallAtLeast: no retry ended the stall, and StallMs is how long
	// the lookup waited at least: until its last attempt, which lost too
	// (it gave up after, or the trace ended).
	StallAtLeast bool `json:"stall_at_least,omitempty"`
	// Retried is true when the resolver's retry was seen (it closed the
	// stall); false when the incident expired without one.
	Retried bool `json:"retried"`
	// Retry is the query that ended the stall (null when not retried).
	Retry     *Retry   `json:"retry"`
	NodeNetNS uint32   `json:"node_netns,omitempty"`
	Lost      []Packet `json:"lost"`
	Sibling   *Sibling `json:"sibling"`
	Winner    *Flow    `json:"winner"`
	Tier      string   `json:"tier"`
	// Pod attribution, filled by the caller when known.
	Pod       string `json:"pod,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Container string `json:"container,omitempty"`
	// RefusedAtSend: no lookup waited. The lost query was dropped inside
	// its send, which told the sender (SendFailed), and the sender asked
	// again at once (Retry); StallMs is 0.
	RefusedAtSend bool `json:"refused_at_send,omitempty"`
	// StaleNAT: the entry that sent the query to a NAT target that is
	// gone (stale_nat).
	StaleNAT *StaleNAT `json:"stale_nat,omitempty"`
	// Upstream: the stall is a local forwarder's (upstream_lost): the
	// query it asked upstream for this question, and what became of it.
	Upstream *Upstream `json:"upstream,omitempty"`
	// Downstream: the clients' queries that waited on this lost query (it
	// was a forwarder's), the first 16; DownstreamMore counts the rest.
	Downstream     []Asker `json:"downstream,omitempty"`
	DownstreamMore int     `json:"downstream_more,omitempty"`

	key   nameKey // its lookup's, while a late answer's waits (forwarder.go)
	owner *stall  // the stall it is part of, if any, until Recycle
}

// Clone returns a copy of inc that shares no memory with it: an incident a
// stall carried is given back for reuse once written (Recycle), so what a
// caller keeps beyond trace.Options.OnIncident must be a clone.
func (inc *Incident) Clone() *Incident {
	c := *inc
	c.owner = nil
	c.Race, c.StallMs, c.Retry = clonePtr(inc.Race), clonePtr(inc.StallMs), clonePtr(inc.Retry)
	c.Sibling, c.Winner, c.Upstream = clonePtr(inc.Sibling), clonePtr(inc.Winner), clonePtr(inc.Upstream)
	if s := inc.StaleNAT; s != nil {
		n := *s
		n.LastAnswerMs, n.Backends = clonePtr(s.LastAnswerMs), slices.Clone(s.Backends)
		c.StaleNAT = &n
	}
	c.Lost = slices.Clone(inc.Lost)
	for i := range c.Lost {
		c.Lost[i].AnsweredMs = clonePtr(c.Lost[i].AnsweredMs)
	}
	c.Downstream = slices.Clone(inc.Downstream)
	return &c
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// StaleNAT is a conntrack entry that outlived its NAT target: made by an
// earlier query of the socket, it keeps sending the socket's queries to a
// backend that is gone (kube-proxy deletes the UDP entries of removed
// endpoints; when it does not, nothing does while the client keeps
// talking: each packet refreshes the entry).
type StaleNAT struct {
	// NetNS is where the entry is (where NAT ran).
	NetNS uint32 `json:"netns"`
	// Entry is its tuples: Src -> Dst as the socket sent, ReplySrc the
	// NAT target, which no longer answers (Gone).
	Entry Flow           `json:"entry"`
	Gone  netip.AddrPort `json:"gone"`
	// LastAnswerMs: its socket's last answer from Dst, this long before
	// the lost query (null: none seen).
	LastAnswerMs *float64 `json:"last_answer_ms,omitempty"`
	// Backends is what the namespace's NAT rules send Dst to now, read as
	// the incident is written (natrules; absent when unreadable), and
	// BackendsFrom where; Fix is the command that deletes the entry.
	Backends     []netip.AddrPort `json:"backends,omitempty"`
	BackendsFrom string           `json:"backends_from,omitempty"`
	Fix          string           `json:"fix,omitempty"`
	// Unread says why Backends or Fix are missing (the entry or its
	// namespace gone before they were read, the rules unreadable).
	Unread string `json:"unread,omitempty"`
}

// Attributed counts the packets dnsrace explained, in the kernel's counter
// names, so each compares with the kernel's own delta.
type Attributed struct {
	InsertFailed uint64 `json:"insert_failed"`
	Drop         uint64 `json:"drop"`
	ClashResolve uint64 `json:"clash_resolve"`
}

// Add adds o's counts to a (to sum namespaces).
func (a *Attributed) Add(o Attributed) {
	a.InsertFailed += o.InsertFailed
	a.Drop += o.Drop
	a.ClashResolve += o.ClashResolve
}

// CounterSource gives the kernel's conntrack counters of a namespace,
// as deltas since tracing began there.
type CounterSource interface {
	Delta(netns uint32) (ctstats.Counters, bool)
}
