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
	if a := c.lastAnswers[uint64(q.sock)>>51&(lastAnswerSlots-1)]; a.sock == q.sock && a.atNs < q.sentNs {
		ms := float64(q.sentNs-a.atNs) / 1e6
		s.LastAnswerMs = &ms
	}
	if d.ct.Ptr == 0 && s.LastAnswerMs == nil {
		return nil // a copy alone does not say the entry is older
	}
	return s
}

// lastAnswerSlots is the size of the table of each socket's last answer:
// direct-mapped, a slot per answer.
const lastAnswerSlots = 1 << 13

type lastAnswer struct {
	sock sockKey
	atNs uint64
}

// noteAnswer records q's socket's last answer (its queries' tuples are
// the socket's, and its entry's original tuple where NAT ran).
func (c *Correlator) noteAnswer(q *query, atNs uint64) {
	c.lastAnswers[uint64(q.sock)>>51&(lastAnswerSlots-1)] = lastAnswer{sock: q.sock, atNs: atNs}
}
