package trace

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/dnsrace/dnsrace/internal/correlate"
)

// WriteIncidentText writes one incident as one line.
func WriteIncidentText(w io.Writer, inc *correlate.Incident) {
	var b strings.Builder
	cause := inc.Cause
	if inc.Race != nil {
		cause += "/" + *inc.Race
	}
	fmt.Fprintf(&b, "%s %-26s %s %s netns %d", inc.Time.Format("15:04:05.000"), cause, inc.QName, inc.QType, inc.NetNS)
	switch {
	case inc.Pod == "":
	case inc.Namespace == "":
		fmt.Fprintf(&b, " %s", inc.Pod)
	default:
		fmt.Fprintf(&b, " pod %s/%s", inc.Namespace, inc.Pod)
		if inc.Container != "" {
			fmt.Fprintf(&b, " (%s)", inc.Container)
		}
	}
	if inc.Comm != "" {
		fmt.Fprintf(&b, " %s[%d]", inc.Comm, inc.PID)
	}
	fmt.Fprintf(&b, " %s->%s", inc.Src, inc.Dst)
	switch {
	case inc.Cause == correlate.CauseClashResolved:
		b.WriteString(": rescued by the kernel, no loss")
	case inc.StallMs != nil:
		fmt.Fprintf(&b, ": stalled %.0f ms", *inc.StallMs)
	default:
		b.WriteString(": no retry seen")
	}
	for _, p := range inc.Lost {
		fmt.Fprintf(&b, "; lost %s id %d", p.QType, p.ID)
		if p.Reason != "" {
			fmt.Fprintf(&b, " (%s", p.Reason)
			if p.Location != "" {
				fmt.Fprintf(&b, " at %s", p.Location)
			}
			fmt.Fprintf(&b, " in netns %d)", p.NetNS)
		}
	}
	if s := inc.Sibling; s != nil {
		state := "pending"
		switch {
		case s.Answered:
			state = "answered"
		case s.Lost:
			state = "lost too"
		}
		fmt.Fprintf(&b, "; sibling %s %s (gap %.0f µs, CPUs %d/%d)", s.QType, state, s.GapUs, s.CPUs[0], s.CPUs[1])
	}
	if w := inc.Winner; w != nil {
		fmt.Fprintf(&b, "; winner %s->%s", w.Src, w.Dst)
		if w.QName != "" {
			fmt.Fprintf(&b, " (%s %s, netns %d)", w.QName, w.QType, w.NetNS)
		}
		if w.ReplyDst != "" {
			fmt.Fprintf(&b, " holds reply %s->%s", w.ReplySrc, w.ReplyDst)
		}
	}
	b.WriteByte('\n')
	io.WriteString(w, b.String())
}

// WriteSummary writes the reconciliation as text or one JSON line, in one
// Write (incidents may be written to w from another goroutine meanwhile).
func WriteSummary(w io.Writer, s *Summary, asJSON bool) {
	if asJSON {
		_ = json.NewEncoder(w).Encode(s)
		return
	}
	var b strings.Builder
	total := 0
	var parts []string
	for _, c := range correlate.Causes {
		if n := s.Incidents[c]; n > 0 {
			total += n
			parts = append(parts, fmt.Sprintf("%s %d", c, n))
		}
	}
	fmt.Fprintf(&b, "\n%s after %.1fs: %d incidents", s.Type, s.DurationS, total)
	if len(parts) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(parts, ", "))
	}
	fmt.Fprintf(&b, "\n  %-14s %8s %11s\n", "conntrack", "kernel", "attributed")
	row := func(name string, k, a uint64) {
		mark := "ok"
		if k != a {
			mark = "MISMATCH"
		}
		fmt.Fprintf(&b, "  %-14s %8d %11d  %s\n", name, k, a, mark)
	}
	row("insert_failed", s.Kernel.InsertFailed, s.Attributed.InsertFailed)
	row("drop", s.Kernel.Drop, s.Attributed.Drop)
	row("clash_resolve", s.Kernel.ClashResolve, s.Attributed.ClashResolve)
	fmt.Fprintf(&b, "  %-14s %8d %11s\n", "early_drop", s.Kernel.EarlyDrop, "-")
	fmt.Fprintf(&b, "  events %d, lost %d, malformed %d; queries %d (%d answered, %d in flight, %d evicted)\n",
		s.Events, s.EventsLost, s.Malformed, s.Queries.Queries, s.Queries.Answered, s.Queries.InFlight, s.Queries.Evicted)
	if s.PcapErrors > 0 {
		fmt.Fprintf(&b, "  pcap: %d incidents could not be written\n", s.PcapErrors)
	}
	for _, m := range s.Mismatch {
		fmt.Fprintf(&b, "  mismatch: %s\n", m)
	}
	fmt.Fprintf(&b, "  probes:")
	for _, p := range s.Probes {
		if p.Attached {
			fmt.Fprintf(&b, " %s=%s", p.Hook, p.Tier)
		}
	}
	b.WriteByte('\n')
	io.WriteString(w, b.String())
}
