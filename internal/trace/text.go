package trace

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/dnsrace/dnsrace/internal/correlate"
)

// rescuedEvery is how often races the kernel rescued are summed up, per
// pod or namespace.
const rescuedEvery = 10 * time.Second

// TextWriter writes incidents for a person at a terminal: a stall (one
// stalled lookup, however many attempts it lost) is a headline (time,
// cause, who, question, stall) and indented detail lines; stalls come out
// in the order they started; races the kernel rescued are summed up per
// pod or namespace at most every 10 s (ShowResolved lists each). Not safe
// for concurrent use: the session's reader drives it.
type TextWriter struct {
	w            io.Writer
	showResolved bool
	// held: stalls that ended while one that started earlier may still
	// be reported
	held []*correlate.Incident
	// incidents with no stall not yet written, summed up by kind and by
	// pod or namespace
	sums      map[sumKey]*sumCount
	lastFlush time.Time
	// done: incidents written or summed up since the last TakeDone
	done []*correlate.Incident
}

// What is summed up, not listed: races the kernel rescued, and sends
// refused and resent at once.
const (
	sumRescued = "rescued"
	sumRefused = "refused"
)

type sumKey struct{ kind, who string }

type sumCount struct {
	n       int
	by      map[string]int // race (rescued), cause (refused)
	first   time.Time
	ordinal int // order of first sight, for stable output
}

// NewTextWriter returns a TextWriter on w.
func NewTextWriter(w io.Writer, showResolved bool) *TextWriter {
	return &TextWriter{w: w, showResolved: showResolved, sums: map[sumKey]*sumCount{}}
}

// Incident takes one incident; it is written now or by a later Release.
func (t *TextWriter) Incident(inc *correlate.Incident) {
	switch {
	case t.showResolved:
	case inc.Cause == correlate.CauseClashResolved:
		race := correlate.RaceSameTuple
		if inc.Race != nil {
			race = *inc.Race
		}
		t.sum(sumRescued, inc, race)
		t.done = append(t.done, inc)
		return
	case inc.RefusedAtSend:
		t.sum(sumRefused, inc, inc.Cause)
		t.done = append(t.done, inc)
		return
	}
	t.held = append(t.held, inc)
}

func (t *TextWriter) sum(kind string, inc *correlate.Incident, by string) {
	k := sumKey{kind, who(inc)}
	c := t.sums[k]
	if c == nil {
		c = &sumCount{by: map[string]int{}, first: inc.Time, ordinal: len(t.sums)}
		t.sums[k] = c
	}
	c.n++
	c.by[by]++
}

// Release writes the held stalls that started before oldestOpen, in the
// order they started, and every 10 s (by now) the rescued races summed up.
// oldestOpen is correlate.Correlator.OldestOpen (zero: none): the earliest
// start of a stall not reported yet, which includes a query still waiting
// for its answer (found lost only at its retry, it starts its stall when it
// was sent); the start of the oldest stall in progress alone let a stall
// found that way come out after later ones.
func (t *TextWriter) Release(oldestOpen, now time.Time) {
	sort.SliceStable(t.held, func(i, j int) bool { return t.held[i].Time.Before(t.held[j].Time) })
	n := 0
	for _, inc := range t.held {
		if oldestOpen.IsZero() || inc.Time.Before(oldestOpen) {
			io.WriteString(t.w, FormatIncident(inc))
			t.done = append(t.done, inc)
			continue
		}
		t.held[n] = inc
		n++
	}
	clear(t.held[n:])
	t.held = t.held[:n]
	if t.lastFlush.IsZero() {
		t.lastFlush = now
	}
	if now.Sub(t.lastFlush) >= rescuedEvery {
		t.flushSums(now)
	}
}

// TakeDone appends to dst the incidents written or summed up since its
// last call, which it no longer reads, and forgets them.
func (t *TextWriter) TakeDone(dst []*correlate.Incident) []*correlate.Incident {
	dst = append(dst, t.done...)
	clear(t.done)
	t.done = t.done[:0]
	return dst
}

// Close writes everything held.
func (t *TextWriter) Close(now time.Time) {
	t.Release(time.Time{}, now)
	t.flushSums(now)
}

func (t *TextWriter) flushSums(now time.Time) {
	t.lastFlush = now
	keys := slices.Collect(maps.Keys(t.sums))
	sort.Slice(keys, func(i, j int) bool { return t.sums[keys[i]].ordinal < t.sums[keys[j]].ordinal })
	var b strings.Builder
	for _, k := range keys {
		c := t.sums[k]
		at, since := now.Format("15:04:05.000"), c.first.Format("15:04:05")
		switch k.kind {
		case sumRescued:
			what := "races"
			if c.n == 1 {
				what = "race"
			}
			if c.by[correlate.RaceSameTuple] == c.n {
				what = "A/AAAA " + what
			}
			fmt.Fprintf(&b, "%s  rescued  %d %s rescued by the kernel, no query lost, in %s since %s", at, c.n, what, k.who, since)
			if len(c.by) > 1 {
				fmt.Fprintf(&b, " (same_tuple %d, reply_clash %d)", c.by[correlate.RaceSameTuple], c.by[correlate.RaceReplyClash])
			}
		case sumRefused:
			what := "queries"
			if c.n == 1 {
				what = "query"
			}
			var causes []string
			for _, cause := range slices.Sorted(maps.Keys(c.by)) {
				causes = append(causes, fmt.Sprintf("%s %d", cause, c.by[cause]))
			}
			fmt.Fprintf(&b, "%s  refused  %d %s refused inside their send, no lookup waited, in %s since %s (%s)",
				at, c.n, what, k.who, since, strings.Join(causes, ", "))
		}
		b.WriteByte('\n')
	}
	clear(t.sums)
	io.WriteString(t.w, b.String())
}

// who names the asker: its pod, "host" for a host process, or its network
// namespace.
func who(inc *correlate.Incident) string {
	switch {
	case inc.Pod == "":
		return fmt.Sprintf("netns %d", inc.NetNS)
	case inc.Namespace == "":
		return inc.Pod
	}
	return "pod " + inc.Namespace + "/" + inc.Pod
}

// FormatIncident is one incident as text: a headline, then indented
// details.
func FormatIncident(inc *correlate.Incident) string {
	var b strings.Builder
	cause := inc.Cause
	if inc.Race != nil {
		cause += "/" + *inc.Race
	}
	stall := "no retry seen"
	switch {
	case inc.Cause == correlate.CauseClashResolved, inc.RefusedAtSend:
		stall = "no stall"
	case inc.StallAtLeast:
		stall = fmt.Sprintf("stalled ≥%.1f s", *inc.StallMs/1e3)
	case inc.StallMs != nil:
		stall = fmt.Sprintf("stalled %.1f s", *inc.StallMs/1e3)
	}
	fmt.Fprintf(&b, "%s  %-23s  %-14s  %s  %s %s\n", inc.Time.Format("15:04:05.000"), cause, stall, who(inc), inc.QName, inc.QType)
	detail := func(label, format string, args ...any) {
		fmt.Fprintf(&b, "    %-8s %s\n", label, fmt.Sprintf(format, args...))
	}
	if inc.Cause == correlate.CauseClashResolved {
		detail("rescued", "lost the conntrack race but the kernel let it through (merged, or inserted reply-only)")
	}
	if inc.RefusedAtSend {
		detail("refused", "dropped inside its send, which returned the error: the sender asked again at once")
	}
	for _, p := range inc.Lost {
		how := "no answer came back; nothing on this node dropped it"
		switch {
		case p.Dropped() && (p.Cause == correlate.CauseReplyUnmatched || p.Cause == correlate.CauseRcvbufFull):
			how = "its answer was dropped" + dropWhere(p)
		case p.Dropped():
			how = "dropped" + dropWhere(p)
		}
		c := p.Cause
		if p.Race != "" {
			c += "/" + p.Race
		}
		detail("lost", "%s id %d (%s): %s, CPU %d", p.QType, p.ID, c, how, p.CPU)
	}
	if s := inc.Sibling; s != nil {
		state := "still waiting"
		switch {
		case s.Answered:
			state = "answered"
		case s.Lost:
			state = "lost too"
		}
		detail("sibling", "%s id %d %s, sent %.0f µs apart on the same socket (CPUs %d/%d)", s.QType, s.ID, state, s.GapUs, s.CPUs[0], s.CPUs[1])
	}
	if w := inc.Winner; w != nil {
		s := fmt.Sprintf("%s -> %s", w.Src, w.Dst)
		if w.QName != "" {
			s += fmt.Sprintf(" (%s %s, netns %d)", w.QName, w.QType, w.NetNS)
		}
		if w.ReplyDst.IsValid() {
			s += fmt.Sprintf(", holds reply %s -> %s", w.ReplySrc, w.ReplyDst)
		}
		detail("winner", "%s", s)
	}
	q := fmt.Sprintf("%s -> %s in netns %d", inc.Src, inc.Dst, inc.NetNS)
	if inc.Comm != "" {
		q = fmt.Sprintf("%s[%d] ", inc.Comm, inc.PID) + q
	}
	if inc.Container != "" {
		q += ", container " + inc.Container
	}
	if inc.NodeNetNS != 0 && inc.NodeNetNS != inc.NetNS {
		q += fmt.Sprintf(", conntrack in netns %d", inc.NodeNetNS)
	}
	detail("query", "%s (%s tier)", q, inc.Tier)
	if r := inc.Retry; r != nil && inc.StallMs != nil {
		detail("retry", "%s id %d from %s, %.0f ms after the lost query", r.QType, r.ID, r.Src, *inc.StallMs)
	}
	if s := inc.StaleNAT; s != nil {
		formatStaleNAT(detail, s)
	}
	if u := inc.Upstream; u != nil {
		formatUpstream(detail, u)
	}
	if len(inc.Downstream) > 0 {
		var who []string
		for _, a := range inc.Downstream {
			who = append(who, fmt.Sprintf("incident %d (netns %d, %s %s id %d)", a.Incident, a.NetNS, a.Src, a.QType, a.ID))
		}
		more := ""
		if inc.DownstreamMore > 0 {
			more = fmt.Sprintf(" and %d more", inc.DownstreamMore)
		}
		detail("askers", "%d queries waited on it: %s%s", len(inc.Downstream)+inc.DownstreamMore, strings.Join(who, ", "), more)
	}
	return b.String()
}

// formatStaleNAT says which entry outlived its NAT target, and what to do.
func formatStaleNAT(detail func(label, format string, args ...any), s *correlate.StaleNAT) {
	where := "in the namespace that NATs"
	if s.NetNS != 0 {
		where = fmt.Sprintf("in netns %d", s.NetNS)
	}
	last := "no answer on it seen"
	if s.LastAnswerMs != nil {
		last = fmt.Sprintf("its socket's last answer %s before", shortDuration(*s.LastAnswerMs))
	}
	detail("stale", "conntrack entry %s -> %s %s still sends to %s, which no longer answers; %s",
		s.Entry.Src, s.Entry.Dst, where, s.Gone, last)
	if len(s.Backends) > 0 {
		var now []string
		for _, b := range s.Backends {
			now = append(now, b.String())
		}
		detail("nat now", "%s goes to %s (%s)", s.Entry.Dst, strings.Join(now, ", "), s.BackendsFrom)
	}
	if s.Fix != "" {
		detail("fix", "%s   (kube-proxy deletes the UDP entries of removed endpoints; this one it missed)", s.Fix)
	}
	if s.Unread != "" {
		detail("unread", "%s", s.Unread)
	}
}

// shortDuration writes ms as ms under a second, else as seconds.
func shortDuration(ms float64) string {
	if ms < 1000 {
		return fmt.Sprintf("%.0f ms", ms)
	}
	return fmt.Sprintf("%.1f s", ms/1e3)
}

// formatUpstream says what became of the forwarder's query behind a stall.
func formatUpstream(detail func(label, format string, args ...any), u *correlate.Upstream) {
	who := fmt.Sprintf("netns %d", u.NetNS)
	if u.Comm != "" {
		who = fmt.Sprintf("%s[%d] in %s", u.Comm, u.PID, who)
	}
	if u.TCP {
		detail("upstream", "%s took the question upstream over TCP (not followed): its answer came late", who)
		return
	}
	when := fmt.Sprintf("sent %.0f ms after this query", u.SentMs)
	if u.SentMs < 0 {
		when = fmt.Sprintf("in flight %.0f ms already: this question joined it", -u.SentMs)
	}
	cause := u.Cause
	if u.Race != "" {
		cause += "/" + u.Race
	}
	lost := ""
	if u.Reason != "" || u.Location != "" {
		p := correlate.Packet{Reason: u.Reason, Location: u.Location, NetNS: u.LostIn}
		lost = ", dropped " + p.DropSite()
	}
	detail("upstream", "%s asked %s %s id %d from %s (%s), lost: %s%s; incident %d",
		who, u.Dst, u.QType, u.ID, u.Src, when, cause, lost, u.Incident)
}

// dropWhere: ": NETFILTER_DROP at nf_hook_slow+0x7d in netns N", or
// " at nf_hook_slow+0x93 in netns N" where the kernel gives no reason
// (before 5.17).
func dropWhere(p correlate.Packet) string {
	if p.Reason != "" {
		return ": " + p.DropSite()
	}
	return " " + p.DropSite()
}

// WriteSummary writes the reconciliation as text or one JSON line, in one
// Write (incidents may be written to w from another goroutine meanwhile).
func WriteSummary(w io.Writer, s *Summary, asJSON bool) {
	if asJSON {
		_ = json.NewEncoder(w).Encode(s)
		return
	}
	io.WriteString(w, FormatSummary(s))
}

// FormatSummary is the reconciliation as text: every number says what it
// counts.
func FormatSummary(s *Summary) string {
	var b strings.Builder
	stalls, rescued := 0, s.Incidents[correlate.CauseClashResolved]
	var parts []string
	for _, c := range correlate.Causes {
		if n := s.Incidents[c]; n > 0 && c != correlate.CauseClashResolved {
			stalls += n
			parts = append(parts, fmt.Sprintf("%s %d", c, n))
		}
	}
	fmt.Fprintf(&b, "\n%s after %.1f s\n", s.Type, s.DurationS)
	fmt.Fprintf(&b, "  lookups that waited out a resolver timeout: %d", stalls)
	if len(parts) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(parts, ", "))
	}
	fmt.Fprintf(&b, "\n  conntrack races the kernel rescued, no query lost: %d\n", rescued)
	if len(s.RefusedAtSend) > 0 {
		refused, parts := 0, []string{}
		for _, c := range correlate.Causes {
			if n := s.RefusedAtSend[c]; n > 0 {
				refused += n
				parts = append(parts, fmt.Sprintf("%s %d", c, n))
			}
		}
		fmt.Fprintf(&b, "  queries refused inside their send (resent at once, or given up), no lookup waited: %d (%s)\n", refused, strings.Join(parts, ", "))
	}
	q := s.Queries
	fmt.Fprintf(&b, "  DNS queries seen: %d; answered %d, lost %d, waiting for an answer now %d, forgotten unfinished (over the %s cap) %d\n",
		q.Queries, q.Answered, q.Lost, q.InFlight, "in-flight", q.Evicted)
	if q.StallsReportedEarly > 0 {
		fmt.Fprintf(&b, "  stalls reported before their retry or timeout (over the cap of stalls in progress): %d\n", q.StallsReportedEarly)
	}
	fmt.Fprintf(&b, "  conntrack counters where DNS was tracked:   kernel  explained by dnsrace\n")
	row := func(name, what string, k, a uint64) {
		mark := "ok"
		if k != a {
			mark = "MISMATCH"
		}
		fmt.Fprintf(&b, "    %-13s %-28s %8d  %8d  %s\n", name, what, k, a, mark)
	}
	row("insert_failed", "packets refused at insertion", s.Kernel.InsertFailed, s.Attributed.InsertFailed)
	row("drop", "packets conntrack dropped", s.Kernel.Drop, s.Attributed.Drop)
	row("clash_resolve", "races the kernel resolved", s.Kernel.ClashResolve, s.Attributed.ClashResolve)
	if s.ClashBeforeWatched > 0 {
		fmt.Fprintf(&b, "      of which %d counted, not named: rescued before dnsrace watched their namespace's confirm (its DNS showed after the start)\n", s.ClashBeforeWatched)
	}
	fmt.Fprintf(&b, "    %-13s %-28s %8d  %8s\n", "early_drop", "entries evicted for room", s.Kernel.EarlyDrop, "-")
	fmt.Fprintf(&b, "  records from the kernel: %d read (%d bytes), %d lost to a full ring buffer, %d malformed\n",
		s.Events, s.EventBytes, s.EventsLost, s.Malformed)
	if len(s.RecursionMisses) > 0 {
		names := slices.Sorted(maps.Keys(s.RecursionMisses))
		var total uint64
		for i, n := range names {
			total += s.RecursionMisses[n]
			names[i] = fmt.Sprintf("%s %d", n, s.RecursionMisses[n])
		}
		fmt.Fprintf(&b, "  hook calls the kernel did not run dnsrace for (a BPF program was already running on that CPU): %d (%s)\n",
			total, strings.Join(names, ", "))
	}
	if f := s.KernelFlows; f != nil {
		fmt.Fprintf(&b, "  kernel flow table: %d queries started, %d ended by their answer, %d ended unanswered (dropped at their server, resent or swept), %d open at the end\n",
			f.Started, f.Answered, f.Unanswered, f.Live)
		if f.Refused > 0 || f.Evicted > 0 {
			fmt.Fprintf(&b, "  flow table full: %d queries untracked (no room: their answers not matched, none taken for a loss), %d flows evicted young to make room (their late answers not matched); --flow-entries makes it larger\n",
				f.Refused, f.Evicted)
		}
	}
	if s.NamespacesReleased > 0 {
		fmt.Fprintf(&b, "  namespaces let go of once nothing else held them: %d (their counters as read just before are in the table above); held now: %d\n",
			s.NamespacesReleased, s.NamespacesHeld)
	}
	if s.PcapErrors > 0 {
		fmt.Fprintf(&b, "  pcap: %d incidents could not be written\n", s.PcapErrors)
	}
	for _, m := range s.Mismatch {
		fmt.Fprintf(&b, "  mismatch: %s\n", m)
	}
	b.WriteString("  probes:")
	for _, p := range s.Probes {
		if p.Attached {
			fmt.Fprintf(&b, " %s=%s", p.Hook, p.Tier)
		}
	}
	b.WriteByte('\n')
	return b.String()
}
