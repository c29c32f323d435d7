package overhead

import (
	"fmt"
	"io"
	"slices"
)

// This file writes a harness run's result as text, and says what fails a
// smoke run.

// WriteText prints a result as tables.
func WriteText(w io.Writer, r *Result) {
	// A count pass alone (--count-only) has cases with no rounds: no rate
	// was measured, and a table of zeros would read as measured.
	rounds := slices.ContainsFunc(r.Cases, func(c CaseResult) bool { return c.Rounds > 0 })
	fmt.Fprintf(w, "kernel %s, %d CPUs, %s tier", r.Kernel, r.CPUs, r.Tier)
	if rounds || len(r.Capacity) > 0 {
		fmt.Fprintf(w, ", %.0fs per round", r.Duration)
	}
	fmt.Fprint(w, "\n\n")
	if rounds {
		fmt.Fprintf(w, "%-13s %12s %12s %-9s %-13s %11s %10s %9s %8s\n", "case", "untraced/s", "traced/s", "ratio", "target", "tracer CPU", "records", "lost", "B/query")
		for _, c := range r.Cases {
			ratio, mark := fmt.Sprintf("%.3f", c.Ratio), "ok"
			switch {
			case c.Invalid && c.RecordsLost == 0:
				ratio, mark = "invalid", "unmatched"
			case c.Invalid:
				ratio, mark = "invalid", "lost"
			case c.Ratio < c.Target:
				mark = "missed"
			}
			perQ := "-"
			if c.BytesPerQuery > 0 {
				perQ = fmt.Sprintf("%.0f", c.BytesPerQuery)
			}
			fmt.Fprintf(w, "%-13s %12.0f %12.0f %-9s >=%.2f %-6s %8.2f c %10d %9d %8s\n",
				c.Name, c.Untraced, c.Traced, ratio, c.Target, mark, c.TracerCPU, c.Records, c.RecordsLost, perQ)
		}
		fmt.Fprintln(w, "(a case whose traced rounds lost records, or whose answers the tracer did not follow to their queries, has no ratio: the tracer shed work)")
		for _, c := range r.Cases {
			if len(c.RatioRange) == 2 {
				fmt.Fprintf(w, "%-13s round by round %.3f to %.3f (%d rounds): a difference within that is noise\n", c.Name, c.RatioRange[0], c.RatioRange[1], c.Rounds)
			}
		}
		for _, c := range r.Cases {
			if c.Unfollowed > 0 {
				fmt.Fprintf(w, "%-13s %d answers the flood read were not followed to their query by the tracer\n", c.Name, c.Unfollowed)
			}
			if c.AfterEviction > 0 {
				fmt.Fprintf(w, "%-13s %d answers came after the correlator had evicted their queries (the oldest past its cap in flight)\n", c.Name, c.AfterEviction)
			}
		}
		for _, c := range r.Cases {
			if c.HooksOnly > 0 {
				fmt.Fprintf(w, "%-13s hooks only (every program emptied, same hooks): %.0f/s, %.3f of untraced", c.Name, c.HooksOnly, c.HooksOnlyRatio)
				if c.Ratio > 0 {
					fmt.Fprintf(w, "; traced is %.3f of hooks only", c.Traced/c.HooksOnly)
				}
				fmt.Fprintln(w)
			}
		}
		for _, c := range r.Cases {
			if l := cpuPerUnitLine(c); l != "" {
				fmt.Fprintf(w, "%-13s %s\n", c.Name, l)
			}
			if l := costSplitLine(c); l != "" {
				fmt.Fprintf(w, "%-13s %s\n", "", l)
			}
		}
		for _, c := range r.Cases {
			if c.Skipped > 0 {
				fmt.Fprintf(w, "%-13s the kernel skipped %d hook calls of the tracer (recursion misses)\n", c.Name, c.Skipped)
			}
		}
		fmt.Fprintln(w)
	}
	writeRuns(w, r)
	if len(r.Capacity) > 0 {
		fmt.Fprintf(w, "%9s %10s %10s %10s %10s %8s %9s %9s %8s\n", "rate", "sent/s", "recv/s", "answers/s", "records/s", "lost", "queries", "CPU", "RSS MB")
		for _, s := range r.Capacity {
			fmt.Fprintf(w, "%9d %10.0f %10.0f %10.0f %10.0f %8d %9d %7.2f c %8.1f\n",
				s.Rate, s.Sent, s.Received, s.Answers, s.RecordsPS, s.Lost, s.Queries, s.TracerCPU, float64(s.RSS)/1e6)
		}
		fmt.Fprintf(w, "highest rate traced with zero lost records: %d queries/s\n", r.MaxZeroLoss)
		for _, s := range r.Capacity {
			if s.Skipped > 0 {
				fmt.Fprintf(w, "%9d the kernel skipped %d hook calls of the tracer (recursion misses)\n", s.Rate, s.Skipped)
			}
		}
	}
}

// Problems lists what makes a smoke run fail: records lost (in any case or
// step), a flood's answers the tracer did not follow, or a tracer that saw
// fewer queries than the responder got.
func Problems(r *Result) []string {
	var p []string
	for _, c := range r.Cases {
		if c.RecordsLost > 0 {
			p = append(p, fmt.Sprintf("case %s: %d records lost: its ratio is not a measurement", c.Name, c.RecordsLost))
		} else if c.Invalid {
			p = append(p, fmt.Sprintf("case %s: %d answers the flood read were not followed to their query: its ratio is not a measurement", c.Name, c.Unfollowed))
		}
	}
	for _, s := range r.Capacity {
		if s.Lost > 0 {
			p = append(p, fmt.Sprintf("%d records lost at %d queries/s", s.Lost, s.Rate))
		}
		if float64(s.Queries) < s.Received*0.99*s.Seconds {
			p = append(p, fmt.Sprintf("at %d queries/s the tracer saw %d queries, the responder %.0f", s.Rate, s.Queries, s.Received*s.Seconds))
		}
	}
	return p
}

// cpuPerUnitLine says what tracing cost each unit of a case in the
// machine's CPU time, and how much the case's target leaves it: traced /
// untraced >= target holds while the traced cost per unit stays under
// untraced / target.
func cpuPerUnitLine(c CaseResult) string {
	if c.UntracedCPUUs <= 0 || c.TracedCPUUs <= 0 {
		return ""
	}
	u := unitOf(c)
	hooks := ""
	if c.HooksOnlyCPUUs > 0 {
		hooks = fmt.Sprintf(" (the hooks alone %.2f)", c.HooksOnlyCPUUs-c.UntracedCPUUs)
	}
	return fmt.Sprintf("machine CPU per %s: %.2f µs untraced, %.2f traced: tracing costs %.2f µs a %s%s, the target leaves %.2f",
		u, c.UntracedCPUUs, c.TracedCPUUs, c.TracedCPUUs-c.UntracedCPUUs, u, hooks, c.UntracedCPUUs*(1/c.Target-1))
}

// costSplitLine splits what tracing cost a unit into parts measured apart:
// the hooks' dispatch (the hooks-only rounds), the programs' own time
// (run_time_ns of the count pass, whose two clock reads a run it
// includes) and the reader (the tracer process's CPU over the traced
// rounds). What none of them accounts for is the rest, printed too, so a
// part nobody measured cannot hide. Empty without the hooks-only rounds or
// a valid count pass.
func costSplitLine(c CaseResult) string {
	if c.UntracedCPUUs <= 0 || c.TracedCPUUs <= 0 || c.HooksOnlyCPUUs <= 0 || c.Traced <= 0 ||
		c.Runs == nil || c.Runs.Invalid || c.Runs.Units <= 0 || c.Runs.PerUnit <= 0 {
		return ""
	}
	hooks := c.HooksOnlyCPUUs - c.UntracedCPUUs
	progs := c.Runs.NsPerUnit / 1e3
	reader := c.TracerCPU / c.Traced * 1e6
	rest := c.TracedCPUUs - c.UntracedCPUUs - hooks - progs - reader
	return fmt.Sprintf("of it: hooks %.2f, programs' own time %.2f (%.2f runs, statistics' clock reads included), reader %.2f, rest %+.2f",
		hooks, progs, c.Runs.PerUnit, reader, rest)
}
