package lab

import (
	"fmt"
	"io"
	"strings"
)

// WriteText writes a report for a person.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "scenario %s on kernel %s (%d CPUs), %s resolver, %d pods, %d backends, %.1fs\n",
		r.Scenario, r.Kernel, r.CPUs, r.Resolver, r.Topology.Pods, r.Topology.Backends, r.DurationS)
	if r.TableFilled > 0 {
		fmt.Fprintf(w, "  conntrack table filled with %d entries (max %d)\n", r.TableFilled, r.ConntrackMax)
	}
	fmt.Fprintf(w, "  lookups      %d ok, %d failed, %d stalled (%d timeouts waited)", r.LookupsOK, r.LookupsFail, r.Stalls, r.StallTimeout)
	if r.Crashed > 0 {
		fmt.Fprintf(w, ", %d client processes crashed", r.Crashed)
	}
	fmt.Fprintln(w)
	if r.Pairs > 0 {
		fmt.Fprintf(w, "  pairs        %d sent, %d lost an answer (%d answers lost)\n", r.Pairs, r.PairsLost, r.AnswersLost)
	}
	fmt.Fprintf(w, "  latency      p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", r.Latency.P50Ms, r.Latency.P99Ms, r.Latency.MaxMs)
	fmt.Fprintf(w, "  packets      %d queries sent by pods, %d answers received, %d lost\n", r.QueriesSent, r.AnswersReceived, r.LostReplies)
	fmt.Fprintf(w, "  servers      %d received, %d answered, %d ignored on purpose\n", r.Servers.Received, r.Servers.Answered, r.Servers.Ignored)
	c := r.Conntrack
	fmt.Fprintf(w, "  conntrack    insert_failed +%d, drop +%d, early_drop +%d, clash_resolve +%d, chaintoolong +%d (%s)\n",
		c.InsertFailed, c.Drop, c.EarlyDrop, c.ClashResolve, c.ChainTooLong, r.natWhere())
	if len(r.ConntrackByNetNS) > 1 {
		for _, n := range r.ConntrackByNetNS {
			fmt.Fprintf(w, "    %-12s insert_failed +%d, drop +%d, clash_resolve +%d (netns %d)\n",
				strings.TrimPrefix(n.Name, r.Topology.Prefix+"-"), n.Conntrack.InsertFailed, n.Conntrack.Drop, n.Conntrack.ClashResolve, n.NetNS)
		}
	}
	fmt.Fprintf(w, "  udp          node no_ports +%d, rcvbuf_errors +%d; pods no_ports +%d, rcvbuf_errors +%d\n",
		r.NodeUDP.NoPorts, r.NodeUDP.RcvbufErrors, r.PodUDP.NoPorts, r.PodUDP.RcvbufErrors)
	if r.Expectation.Text == "" {
		return
	}
	verdict := "MET"
	if !r.Expectation.Met {
		verdict = "NOT MET: " + strings.Join(r.Expectation.Failures, "; ")
	}
	fmt.Fprintf(w, "  expectation  %s: %s\n", r.Expectation.Text, verdict)
}

// natWhere says in words where the conntrack counters were read.
func (r *Report) natWhere() string {
	if !r.Topology.LocalNAT {
		return fmt.Sprintf("node netns %d", r.NodeNetNS)
	}
	return fmt.Sprintf("summed over the %d pods' own netns, where the NAT is", len(r.NATNetNS))
}
