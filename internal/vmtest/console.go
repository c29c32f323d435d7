package vmtest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// A console log is the guest's serial console with two lines of the host's
// around it. Every marker is one line, "VMTEST-<KIND> ...", found even after
// a kernel message on the same line:
//
//	VMTEST-PLAN {GuestPlan as JSON}                      host, before boot
//	VMTEST-BOOT kernel=L uname=U uptime=S cpus=N         guest, at /init
//	VMTEST-MODULES loaded=N failed=N uptime=S
//	VMTEST-GETENT localhost=...
//	VMTEST-CELL tier=T suite=S                           a run starts; test2json events follow
//	VMTEST-END tier=T suite=S rc=N seconds=N             the run ended with exit status rc
//	VMTEST-DONE uptime=S                                 every run ended
//	VMTEST-HOST {HostResult as JSON}                     host, after qemu exited
//
// Between CELL and END the guest prints the test binary's test2json events,
// one JSON object a line.

// GuestPlan is what the host booted: the first line of a console log.
type GuestPlan struct {
	Kernel string `json:"kernel"` // the kernels.txt label
	Guest  string `json:"guest"`  // the log's name: label[@tiers]
	Arch   string `json:"arch"`
	Suite  string `json:"suite"`  // Debian suite
	Wanted string `json:"wanted"` // the kernels.txt package
	// Package and Version are the image package apt fetched; Parts the
	// packages it depends on that hold the kernel and its modules (Linux 7
	// splits them: linux-binary-*, linux-modules-*, linux-base-*), as
	// name=version.
	Package string         `json:"package"`
	Version string         `json:"version"`
	Parts   []string       `json:"parts,omitempty"`
	Pin     string         `json:"pin"` // pinned, glob or fallback
	Uname   string         `json:"uname"`
	Tiers   []string       `json:"tiers"` // this guest's
	Suites  []PlannedSuite `json:"suites"`
	Accel   string         `json:"accel"`
	Timeout int            `json:"timeout"`
}

// PlannedSuite is a suite and the tiers it runs in.
type PlannedSuite struct {
	Name  string   `json:"name"`
	Tiers []string `json:"tiers"`
}

// HostResult is how qemu ended: the last line of a console log.
type HostResult struct {
	RC       int     `json:"rc"`
	Seconds  float64 `json:"seconds"`
	TimedOut bool    `json:"timed_out"`
}

// Cell is one suite run in one tier on one kernel.
type Cell struct {
	Kernel, Tier, Suite string
	// Status is pass (a test passed, the binary exited 0), skip (none
	// passed, exit 0) or fail; Note says why a cell failed without
	// an exit status: timeout (the host killed the guest) or no-result.
	Status, Note   string
	RC, Seconds    int
	Passed, Failed int
	Skipped        int
	FailedTests    []string // failed tests and subtests, in order
	Output         []string // the run's output lines, test2json's decoded
	// messages: each test's last messages (the first line of each
	// t.Log/t.Error), for a failed test's digest at the log's tail.
	messages       map[string][]string
	started, ended bool
}

// Runs is a RUNS line of TestRunsPerUnit: BPF program runs and time per
// unit of a cost case.
type Runs struct {
	Kernel, Tier, Case string
	// Accel is how the guest ran (GuestPlan.Accel): under tcg its times
	// are the emulator's, not a measurement of any hardware.
	Accel string
	Total string
	// NsPerUnit is the programs' time per unit ("" in a line without
	// times).
	NsPerUnit string
	Progs     []string // prog=runs[@NSns], in the line's order
}

// GuestLog is one console log, parsed.
type GuestLog struct {
	Path        string
	Plan        GuestPlan
	Uname       string
	BootSeconds string // guest uptime at /init
	Modules     string // loaded=N failed=N
	Done        bool
	Host        *HostResult
	Crash       string // the guest kernel's first oops or panic, and where
	Cells       []*Cell
	Runs        []Runs
	Tail        []string // the console's last lines outside cells
}

// Label is the kernel's label.
func (g *GuestLog) Label() string {
	if g.Plan.Kernel != "" {
		return g.Plan.Kernel
	}
	return "unknown"
}

// Note says how the guest ended: done, timeout or incomplete.
func (g *GuestLog) Note() string {
	switch {
	case g.Done:
		return "done"
	case g.Host != nil && g.Host.TimedOut:
		return "timeout"
	case g.Uname == "":
		return "never reached /init"
	}
	return "incomplete"
}

// testEvent is the part of a test2json event the harness reads.
type testEvent struct {
	Action string
	Test   string
	Output string
}

var (
	crashRE   = regexp.MustCompile(`(Oops: |BUG: |Internal error: |Kernel panic - not syncing).*`)
	crashAtRE = regexp.MustCompile(`(?:RIP: [0-9a-f]+:|pc : )(\S+)`)
	eventRE   = regexp.MustCompile(`\{"(?:Time|Action)":`)
	// messageRE: the first line of a t.Log or t.Error ("    file_test.go:12: ...")
	messageRE = regexp.MustCompile(`^\s+\S+\.go:\d+: `)
)

const tailLines = 30

// ParseConsole reads a console log.
func ParseConsole(r io.Reader) (*GuestLog, error) {
	g := &GuestLog{}
	var cur *Cell
	crashAt := ""
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if line == "" && err != nil {
			if err != io.EOF {
				return g, fmt.Errorf("reading the console: %w", err)
			}
			break
		}
		line = strings.TrimRight(line, "\r\n")
		line = strings.ReplaceAll(line, "\r", "")
		if g.Crash == "" {
			if m := crashRE.FindString(line); m != "" {
				if i := strings.Index(m, " [#"); i >= 0 {
					m = m[:i]
				}
				g.Crash = m
			}
		}
		if g.Crash != "" && crashAt == "" {
			if m := crashAtRE.FindStringSubmatch(line); m != nil {
				crashAt = m[1]
			}
		}
		if i := strings.Index(line, "VMTEST-"); i >= 0 {
			kind, rest, _ := strings.Cut(line[i+len("VMTEST-"):], " ")
			if cur2, ok := g.marker(kind, rest, cur); ok {
				cur = cur2
				continue
			}
		}
		if cur == nil {
			g.Tail = append(g.Tail, line)
			if len(g.Tail) > tailLines {
				g.Tail = g.Tail[1:]
			}
			continue
		}
		if loc := eventRE.FindStringIndex(line); loc != nil {
			var ev testEvent
			if json.Unmarshal([]byte(line[loc[0]:]), &ev) == nil {
				g.event(cur, ev)
				continue
			}
		}
		cur.Output = append(cur.Output, line)
	}
	if crashAt != "" {
		g.Crash += " at " + crashAt
	}
	g.finish()
	return g, nil
}

// marker handles one marker line; ok is false for an unknown kind or one
// that does not parse (then the line is plain console text).
func (g *GuestLog) marker(kind, rest string, cur *Cell) (*Cell, bool) {
	kv := fields(rest)
	switch kind {
	case "PLAN":
		if json.Unmarshal([]byte(rest), &g.Plan) != nil {
			return cur, false
		}
	case "HOST":
		var h HostResult
		if json.Unmarshal([]byte(rest), &h) != nil {
			return cur, false
		}
		g.Host = &h
	case "BOOT":
		g.Uname, g.BootSeconds = kv["uname"], kv["uptime"]
		if g.Plan.Kernel == "" {
			g.Plan.Kernel = kv["kernel"]
		}
	case "MODULES":
		g.Modules = "loaded=" + kv["loaded"] + " failed=" + kv["failed"]
	case "GETENT":
	case "CELL":
		c := g.cell(kv["tier"], kv["suite"])
		c.started = true
		return c, true
	case "END":
		c := g.cell(kv["tier"], kv["suite"])
		c.ended = true
		c.RC, _ = strconv.Atoi(kv["rc"])
		c.Seconds, _ = strconv.Atoi(kv["seconds"])
		return nil, true
	case "DONE":
		g.Done = true
	default:
		return cur, false
	}
	return cur, true
}

func (g *GuestLog) event(c *Cell, ev testEvent) {
	switch ev.Action {
	case "output":
		out := strings.TrimSuffix(ev.Output, "\n")
		c.Output = append(c.Output, out)
		if ev.Test != "" && messageRE.MatchString(out) {
			c.noteMessage(ev.Test, out)
		}
		if i := strings.Index(out, "RUNS kernel="); i >= 0 {
			g.runs(out[i:])
		}
	case "pass", "fail", "skip":
		if ev.Test == "" {
			return
		}
		if ev.Action == "fail" && !slices.Contains(c.FailedTests, ev.Test) {
			c.FailedTests = append(c.FailedTests, ev.Test)
		}
		if strings.Contains(ev.Test, "/") {
			return
		}
		switch ev.Action {
		case "pass":
			c.Passed++
		case "fail":
			c.Failed++
		case "skip":
			c.Skipped++
		}
	}
}

// runs records a RUNS line:
// RUNS kernel=K tier=T case=C unit=U total=N [ns_per_unit=NS] prog=N[@NSns]...
func (g *GuestLog) runs(line string) {
	r := Runs{Kernel: g.Label(), Accel: g.Plan.Accel}
	for _, w := range strings.Fields(line)[1:] {
		k, v, _ := strings.Cut(w, "=")
		switch k {
		case "kernel", "unit":
		case "tier":
			r.Tier = v
		case "case":
			r.Case = v
		case "total":
			r.Total = v
		case "ns_per_unit":
			r.NsPerUnit = v
		default:
			r.Progs = append(r.Progs, w)
		}
	}
	g.Runs = append(g.Runs, r)
}

func (g *GuestLog) cell(tier, suite string) *Cell {
	for _, c := range g.Cells {
		if c.Tier == tier && c.Suite == suite {
			return c
		}
	}
	c := &Cell{Kernel: g.Label(), Tier: tier, Suite: suite}
	g.Cells = append(g.Cells, c)
	return c
}

// finish adds the planned cells that never reported, in plan order, and
// sets every cell's status.
func (g *GuestLog) finish() {
	seen := g.Cells
	g.Cells = nil
	for _, t := range g.Plan.Tiers {
		for _, s := range g.Plan.Suites {
			if !slices.Contains(s.Tiers, t) {
				continue
			}
			i := slices.IndexFunc(seen, func(c *Cell) bool { return c.Tier == t && c.Suite == s.Name })
			if i < 0 {
				g.Cells = append(g.Cells, &Cell{Tier: t, Suite: s.Name})
				continue
			}
			g.Cells = append(g.Cells, seen[i])
			seen = slices.Delete(seen, i, i+1)
		}
	}
	g.Cells = append(g.Cells, seen...)
	for _, c := range g.Cells {
		c.Kernel = g.Label()
		switch {
		case !c.ended && g.Host != nil && g.Host.TimedOut:
			c.Status, c.Note = "fail", "timeout"
		case !c.ended:
			c.Status, c.Note = "fail", "no-result"
		case c.RC != 0:
			c.Status, c.Note = "fail", fmt.Sprintf("rc=%d,seconds=%d", c.RC, c.Seconds)
		case c.Passed > 0:
			c.Status, c.Note = "pass", fmt.Sprintf("rc=0,seconds=%d", c.Seconds)
		default:
			c.Status, c.Note = "skip", fmt.Sprintf("rc=0,seconds=%d", c.Seconds)
		}
	}
}

// fields reads key=value words.
func fields(s string) map[string]string {
	m := map[string]string{}
	for _, w := range strings.Fields(s) {
		if k, v, ok := strings.Cut(w, "="); ok {
			m[k] = v
		}
	}
	return m
}

// DecodeConsole writes a console log as text: each test2json output event
// as the line the test printed, other events left out, every other line as
// it is. The text reads like `go test -v` between the markers.
func DecodeConsole(r io.Reader, w io.Writer) error {
	br := bufio.NewReader(r)
	bw := bufio.NewWriter(w)
	for {
		line, err := br.ReadString('\n')
		if loc := eventRE.FindStringIndex(line); loc != nil {
			var ev testEvent
			if json.Unmarshal([]byte(line[loc[0]:]), &ev) == nil {
				if ev.Action == "output" {
					bw.WriteString(line[:loc[0]] + ev.Output)
				}
				line = ""
			}
		}
		bw.WriteString(line)
		if err == io.EOF {
			return bw.Flush()
		}
		if err != nil {
			return fmt.Errorf("reading the console: %w", err)
		}
	}
}

// messagesKept is how many of a test's last messages its cell keeps: a
// failed test's errors come after its logs, and a CI log's tail has room
// for a few lines a test.
const messagesKept = 4

func (c *Cell) noteMessage(test, line string) {
	if c.messages == nil {
		c.messages = map[string][]string{}
	}
	m := append(c.messages[test], strings.TrimSpace(line))
	if len(m) > messagesKept {
		m = m[1:]
	}
	c.messages[test] = m
}
