package overhead

// This file is what a harness run found, as `dnsrace bench --json` writes
// it.

// CaseResult is the outcome of one Case.
type CaseResult struct {
	Name   string `json:"name"`
	Path   string `json:"path"`
	DNS    bool   `json:"dns"`
	Rounds int    `json:"rounds"`
	// Packets per second counted at the sink, per round.
	UntracedPPS []float64 `json:"untraced_pps"`
	TracedPPS   []float64 `json:"traced_pps"`
	// With Config.Floor: the rounds with empty programs at the tracer's
	// hooks, their rate and its ratio to untraced.
	HooksOnlyPPS   []float64 `json:"hooks_only_pps,omitempty"`
	HooksOnly      float64   `json:"hooks_only,omitempty"`
	HooksOnlyRatio float64   `json:"hooks_only_ratio,omitempty"`
	// Totals over all rounds (packets / seconds).
	Untraced float64 `json:"untraced"`
	Traced   float64 `json:"traced"`
	Ratio    float64 `json:"ratio"`
	// RatioRange: the lowest and highest traced/untraced of one round
	// (each traced round against the untraced round of its number), with
	// two rounds or more and a ratio: how far the machine's noise moves
	// the ratio, so two runs are compared against it.
	RatioRange []float64 `json:"ratio_range,omitempty"`
	Target     float64   `json:"target"`
	// The tracer while traced: CPU in cores, records, record bytes, records
	// lost, hook calls the kernel skipped its programs for (recursion
	// misses: a program already running on that CPU, as when a softirq
	// frees memory inside tp_kmem_cache_free; shown, as nearly all of them
	// would have sent nothing). A case whose traced rounds lost records has
	// no ratio (Invalid): a tracer that sheds work is not measured.
	TracerCPU   float64 `json:"tracer_cpu_cores"`
	Records     uint64  `json:"records"`
	RecordBytes uint64  `json:"record_bytes"`
	RecordsLost uint64  `json:"records_lost"`
	Skipped     uint64  `json:"hook_calls_skipped"`
	Invalid     bool    `json:"invalid"`
	// DNS cases: what the kernel side sent per answered query.
	Answered uint64 `json:"queries_answered,omitempty"`
	// DNS cases: answers the flood read that the tracer's kernel side did
	// not follow to their query (no flow: no answer record). Past 1% of
	// them the case is Invalid too: programs that lose track of queries do
	// less work than ones that follow them.
	Unfollowed uint64 `json:"answers_unfollowed,omitempty"`
	// AfterEviction: answers the kernel side followed whose queries the
	// correlator had already forgotten, the oldest past its cap of queries
	// in flight (the tracer counts them as evicted). Each was read and
	// looked up like any other: the round did the work it measures, but a
	// trace under such a flood would not report those queries' fate.
	AfterEviction   uint64  `json:"answers_after_eviction,omitempty"`
	RecordsPerQuery float64 `json:"records_per_answered_query,omitempty"`
	BytesPerQuery   float64 `json:"bytes_per_answered_query,omitempty"`
	// The count pass: every program's runs over the case's units.
	Runs *Runs `json:"runs,omitempty"`
	// The whole machine's busy CPU time (every process, the kernel's
	// softirqs, the tracer) per packet, query or loop counted, untraced and
	// traced: what tracing adds to a unit in microseconds, against the
	// budget the target's ratio allows. Not set for an invalid case.
	UntracedCPUUs float64 `json:"machine_cpu_us_per_unit_untraced,omitempty"`
	TracedCPUUs   float64 `json:"machine_cpu_us_per_unit_traced,omitempty"`
	// With Config.Floor: the same for the hooks-only rounds.
	HooksOnlyCPUUs float64 `json:"machine_cpu_us_per_unit_hooks_only,omitempty"`
}

// Step is one rate of the capacity search: paced DNS queries from pod0
// through the node to the responder, answered, with the tracer attached.
type Step struct {
	Rate        int     `json:"rate"`
	Seconds     float64 `json:"seconds"`
	Sent        float64 `json:"sent_per_s"`
	Received    float64 `json:"received_per_s"`
	Answers     float64 `json:"answers_per_s"`
	Records     uint64  `json:"records"`
	RecordBytes uint64  `json:"record_bytes"`
	RecordsPS   float64 `json:"records_per_s"`
	Lost        uint64  `json:"records_lost"`
	Skipped     uint64  `json:"hook_calls_skipped"`
	Queries     uint64  `json:"queries_traced"`
	Answered    uint64  `json:"queries_answered"`
	Incidents   int     `json:"incidents"`
	TracerCPU   float64 `json:"tracer_cpu_cores"`
	RSS         uint64  `json:"tracer_rss_bytes"`
	PeakRSS     uint64  `json:"tracer_peak_rss_bytes"`
	// Reached is false when the generator could not send the rate (the
	// machine ran out of CPU before the tracer lost anything).
	Reached bool `json:"reached"`
}

// Result is a whole run.
type Result struct {
	Kernel   string       `json:"kernel"`
	CPUs     int          `json:"cpus"`
	Tier     string       `json:"tier"`
	Duration float64      `json:"duration_s"`
	Cases    []CaseResult `json:"cases"`
	Capacity []Step       `json:"capacity"`
	// MaxZeroLoss is the highest rate of the ladder traced with no lost
	// record (0: none).
	MaxZeroLoss int `json:"max_zero_loss_rate"`
}
