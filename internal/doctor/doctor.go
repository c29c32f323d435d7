package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
)

// Verdict is a check's outcome.
type Verdict string

const (
	OK   Verdict = "ok"
	Warn Verdict = "warn"
	Fail Verdict = "fail"
	Skip Verdict = "skip"
)

// Result is what one check found.
type Result struct {
	ID       string   `json:"id"`
	Verdict  Verdict  `json:"verdict"`
	Summary  string   `json:"summary"`
	Evidence []string `json:"evidence"`
	Fix      string   `json:"fix"`
	Reason   string   `json:"reason"` // why a check was skipped
}

// Report is the outcome of a doctor run.
type Report struct {
	Checks []Result `json:"checks"`
	Exit   int      `json:"exit"`
}

// Config says where and how to look.
type Config struct {
	// Root is the host's root directory ("/" on the node itself).
	Root string
	// Live allows netlink, exec and BPF probes in the running kernel.
	Live bool
	// NetNS are extra network namespaces (paths) for the live conntrack and
	// kube-proxy checks.
	NetNS []string
	// IptablesSave and NftRuleset are saved dumps (iptables-save, nft list
	// ruleset) to read instead of the live rules.
	IptablesSave string
	NftRuleset   string
	// Checks restricts the run to these ids; empty means all.
	Checks []string
	// MaxEvidence caps the evidence lines of a check (0: 40).
	MaxEvidence int
}

// ErrUnknownCheck is returned by Run for a Config.Checks id that does not exist.
var ErrUnknownCheck = errors.New("unknown check")

// check is one named check.
type check struct {
	id  string
	run func(ctx context.Context, e *env) Result
}

// allChecks lists every check in the order they print.
var allChecks = []check{
	{"resolvers", checkResolvers},
	{"bridge-takeover", checkBridge},
	{"conntrack", checkConntrack},
	{"kernel-fix", checkKernel},
	{"kube-proxy", checkKubeProxy},
	{"stale-nat", checkStaleNAT},
	{"pod-resolvers", checkPods},
	{"tracing", checkTracing},
}

// CheckIDs returns the ids of every check.
func CheckIDs() []string {
	ids := make([]string, len(allChecks))
	for i, c := range allChecks {
		ids[i] = c.id
	}
	return ids
}

// env is what checks read through.
type env struct {
	Config
}

// Run runs the selected checks and returns the report.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if cfg.MaxEvidence <= 0 {
		cfg.MaxEvidence = 40
	}
	want := map[string]bool{}
	for _, id := range cfg.Checks {
		found := false
		for _, c := range allChecks {
			if c.id == id {
				found = true
			}
		}
		if !found {
			return Report{}, fmt.Errorf("selecting checks: %w %q (have %s)", ErrUnknownCheck, id, strings.Join(CheckIDs(), ", "))
		}
		want[id] = true
	}
	e := &env{Config: cfg}
	var rep Report
	for _, c := range allChecks {
		if len(want) > 0 && !want[c.id] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		r := runOne(ctx, e, c)
		rep.Checks = append(rep.Checks, r)
	}
	rep.Exit = exitCode(rep.Checks)
	return rep, nil
}

func runOne(ctx context.Context, e *env, c check) (r Result) {
	defer func() {
		if p := recover(); p != nil {
			r = Result{ID: c.id, Verdict: Skip, Reason: fmt.Sprintf("internal error in check: %v", p),
				Evidence: []string{firstLines(string(debug.Stack()), 6)}}
		}
		r.ID = c.id
		r.Evidence = dedupe(r.Evidence)
		if r.Evidence == nil {
			r.Evidence = []string{}
		}
		if len(r.Evidence) > e.MaxEvidence {
			n := len(r.Evidence) - e.MaxEvidence
			r.Evidence = append(r.Evidence[:e.MaxEvidence:e.MaxEvidence], fmt.Sprintf("... %d more lines", n))
		}
		if r.Verdict == Skip && r.Summary == "" {
			r.Summary = "skipped: " + r.Reason
		}
	}()
	return c.run(ctx, e)
}

func exitCode(rs []Result) int {
	for _, r := range rs {
		if r.Verdict == Warn || r.Verdict == Fail {
			return 1
		}
	}
	return 0
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, " | ")
}

// WriteJSON writes the report as one JSON document.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if r.Checks == nil {
		r.Checks = []Result{}
	}
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("writing JSON report: %w", err)
	}
	return nil
}

// WriteText writes the report as aligned lines: one verdict line per check,
// then its evidence and fix indented below it.
func (r Report) WriteText(w io.Writer) error {
	width := 0
	for _, c := range r.Checks {
		width = max(width, len(c.ID))
	}
	var b strings.Builder
	indent := strings.Repeat(" ", 7+2)
	for _, c := range r.Checks {
		summary := c.Summary
		if c.Verdict == Skip {
			summary = "skipped: " + c.Reason
		}
		fmt.Fprintf(&b, "[%-4s] %-*s  %s\n", strings.ToUpper(string(c.Verdict)), width, c.ID, summary)
		for _, ev := range c.Evidence {
			fmt.Fprintf(&b, "%s%s\n", indent, ev)
		}
		if c.Fix != "" && (c.Verdict == Warn || c.Verdict == Fail) {
			fmt.Fprintf(&b, "%sfix: %s\n", indent, c.Fix)
		}
	}
	_, err := io.WriteString(w, b.String())
	if err != nil {
		return fmt.Errorf("writing report: %w", err)
	}
	return nil
}

// problems collects inputs a check could not read. finish turns a would-be
// ok into a skip when any input was missing, so partial input never yields
// a false ok; a warn or fail stands, with the problems added as evidence.
type problems []string

func (p *problems) addf(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

func (p problems) finish(r Result) Result {
	if len(p) == 0 {
		return r
	}
	if r.Verdict == OK {
		return Result{Verdict: Skip, Reason: strings.Join(p, "; "), Evidence: r.Evidence}
	}
	for _, s := range p {
		r.Evidence = append(r.Evidence, "could not read: "+s)
	}
	return r
}

// worst returns the more severe of two verdicts (fail > warn > ok > skip).
func worst(a, b Verdict) Verdict {
	rank := map[Verdict]int{Skip: 0, OK: 1, Warn: 2, Fail: 3}
	if rank[b] > rank[a] {
		return b
	}
	return a
}
