package correlate

// staleNAT describes the entry that sent q, dropped as d, to its NAT
// target, when that entry was made by an earlier query of q's socket: a
// drop with the entry (confirmed, NATed, answered before q), or a copy of
// q after NAT dropped elsewhere while q's socket had an answer from q's
// destination before. Nil otherwise. The socket's last answer is found
// among its queries still followed (QueryTTL).
func (c *Correlator) staleNAT(q *query, d *pendingDrop) *StaleNAT {
	var s *StaleNAT
	switch {
	case d.ct.Ptr != 0:
		if !d.ct.Confirmed() || !d.ct.Answered() || !d.ct.DNATed() {
			return nil
		}
		s = &StaleNAT{NetNS: d.netns, Gone: d.ct.Reply.Src,
			Entry: Flow{Src: d.ct.Orig.Src, Dst: d.ct.Orig.Dst, ReplySrc: d.ct.Reply.Src, ReplyDst: d.ct.Reply.Dst}}
	case d.copy.IsValid():
		// Where the entry is, the drop does not say: the session finds it.
		s = &StaleNAT{Gone: d.copy.Dst, Entry: Flow{Src: q.src, Dst: q.dst, ReplySrc: d.copy.Dst, ReplyDst: d.copy.Src}}
	default:
		return nil
	}
	if a := c.lastAnswerOf(q.sock); a != nil && a.atNs < q.sentNs {
		ms := float64(q.sentNs-a.atNs) / 1e6
		s.LastAnswerMs = &ms
	}
	if d.ct.Ptr == 0 && s.LastAnswerMs == nil {
		return nil // a copy alone does not say the entry is older
	}
	return s
}

// lastAnswerSlots is the size of the table of each socket's last answer:
// sets of lastAnswerWays slots, a socket's set chosen by its key.
const (
	lastAnswerSlots = 1 << 13
	lastAnswerWays  = 4
	// lastAnswerKeep: a slot whose socket was last answered longer ago
	// is free, whatever its count (the socket is closed, or silent).
	lastAnswerKeep = 600e9 // ns
)

// lastAnswer is a socket's last answer and how many it had. A stale entry
// needs a socket that keeps its port, answered before: a full set gives up
// its slot of fewest answers, so the one-shot sockets of a node's pods
// (one answer each, thousands a minute) take each other's slots and leave
// a forwarder's long-lived socket in place.
type lastAnswer struct {
	sock    sockKey
	atNs    uint64
	answers uint64
}

func (c *Correlator) lastAnswerSet(sock sockKey) []lastAnswer {
	i := int(uint64(sock)>>51&(lastAnswerSlots-1)) &^ (lastAnswerWays - 1)
	return c.lastAnswers[i : i+lastAnswerWays]
}

// lastAnswerOf returns sock's last answer, or nil.
func (c *Correlator) lastAnswerOf(sock sockKey) *lastAnswer {
	set := c.lastAnswerSet(sock)
	for i := range set {
		if set[i].sock == sock && set[i].answers > 0 {
			return &set[i]
		}
	}
	return nil
}

// noteAnswer records q's socket's last answer (its queries' tuples are
// the socket's, and its entry's original tuple where NAT ran).
func (c *Correlator) noteAnswer(q *query, atNs uint64) {
	set := c.lastAnswerSet(q.sock)
	victim := 0
	for i := range set {
		if set[i].sock == q.sock {
			set[i].atNs = atNs
			set[i].answers++
			return
		}
		if set[i].atNs+lastAnswerKeep < atNs {
			set[i].answers = 0 // free
		}
		if set[i].answers < set[victim].answers ||
			set[i].answers == set[victim].answers && set[i].atNs < set[victim].atNs {
			victim = i
		}
	}
	set[victim] = lastAnswer{sock: q.sock, atNs: atNs, answers: 1}
}
