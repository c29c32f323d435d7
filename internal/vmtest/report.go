package vmtest

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// failedTail is how many of a failed cell's last output lines the report
// shows: the failing test's errors and logs, so a CI log says why.
const failedTail = 40

// Report is the matrix of a run's guests.
type Report struct {
	Guests       []*GuestLog
	TotalSeconds float64
}

// Failed reports whether a cell failed or nothing ran.
func (r *Report) Failed() bool {
	n := 0
	for _, g := range r.Guests {
		for _, c := range g.Cells {
			n++
			if c.Status == "fail" {
				return true
			}
		}
	}
	return n == 0
}

// Write prints the report: the runs table first, then the output of the
// failed cells, and the matrix with its failed tests last, where a CI log's
// tail shows them.
func (r *Report) Write(w io.Writer) {
	r.writeRuns(w)
	r.writeFailedOutput(w)
	r.writeMatrix(w)
}

func (r *Report) writeMatrix(w io.Writer) {
	var kernels, tiers []string
	suites := map[string][]string{}
	uname := map[string]string{}
	status := map[[3]string]*Cell{}
	for _, g := range r.Guests {
		k := g.Label()
		if !slices.Contains(kernels, k) {
			kernels = append(kernels, k)
		}
		if uname[k] == "" {
			uname[k] = g.Uname
			if uname[k] == "" {
				uname[k] = g.Plan.Uname
			}
		}
		for _, c := range g.Cells {
			if !slices.Contains(tiers, c.Tier) {
				tiers = append(tiers, c.Tier)
			}
			if !slices.Contains(suites[k], c.Suite) {
				suites[k] = append(suites[k], c.Suite)
			}
			status[[3]string{k, c.Tier, c.Suite}] = c
		}
	}
	// a column fits "fail(no-result)"
	width := 10
	for _, c := range status {
		width = max(width, len(c.shown()))
	}
	fmt.Fprintf(w, "\n%-10s %-28s %-12s", "kernel", "uname", "suite")
	for _, t := range tiers {
		fmt.Fprintf(w, " %-*s", width, t)
	}
	fmt.Fprintln(w)
	for _, k := range kernels {
		if len(suites[k]) == 0 {
			fmt.Fprintf(w, "%-10s %-28s %-12s (no cells)\n", k, dash(uname[k]), "-")
		}
		for _, s := range suites[k] {
			fmt.Fprintf(w, "%-10s %-28s %-12s", k, dash(uname[k]), s)
			for _, t := range tiers {
				v := "-"
				if c := status[[3]string{k, t, s}]; c != nil {
					v = c.shown()
				}
				fmt.Fprintf(w, " %-*s", width, v)
			}
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintln(w)
	for _, k := range kernels {
		var gs []*GuestLog
		for _, g := range r.Guests {
			if g.Label() == k {
				gs = append(gs, g)
			}
		}
		for _, g := range gs {
			fmt.Fprintf(w, "kernel %s: %s", k, g.packages())
			fmt.Fprintf(w, ", boot %s s, guest wall %s s, qemu rc %s, %s", dash(g.BootSeconds), hostField(g, "wall"), hostField(g, "rc"), g.Note())
			if len(gs) > 1 {
				fmt.Fprintf(w, " (tiers %s)", strings.Join(g.Plan.Tiers, ","))
			}
			if g.Plan.Pin == "fallback" {
				fmt.Fprintf(w, " (fallback: kernels.txt pins %s, which the archive no longer has)", g.Plan.Wanted)
			}
			if g.Crash != "" {
				fmt.Fprintf(w, "; guest kernel died: %s", g.Crash)
			}
			fmt.Fprintln(w)
		}
	}
	var failed []string
	pass, skip, fail := 0, 0, 0
	for _, g := range r.Guests {
		for _, c := range g.Cells {
			switch c.Status {
			case "pass":
				pass++
			case "skip":
				skip++
			default:
				fail++
			}
			for _, t := range c.FailedTests {
				failed = append(failed, fmt.Sprintf("  %s %s %s: %s", c.Kernel, c.Tier, c.Suite, t))
				for _, m := range c.messages[t] {
					failed = append(failed, "      "+clip(m, messageWidth))
				}
			}
		}
	}
	if len(failed) > 0 {
		fmt.Fprintln(w, "failed tests (kernel tier suite: test), each with its last messages:")
		for _, f := range failed {
			fmt.Fprintln(w, f)
		}
	}
	fmt.Fprintf(w, "cells: %d pass, %d skip, %d fail; total wall time %.0f s\n", pass, skip, fail, r.TotalSeconds)
}

// messageWidth clips a failed test's message lines at the log's tail.
const messageWidth = 400

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + " …"
}

// shown is a cell's status in the matrix: fail(timeout) and
// fail(no-result) for a cell with no exit status.
func (c *Cell) shown() string {
	if c.Note == "timeout" || c.Note == "no-result" {
		return c.Status + "(" + c.Note + ")"
	}
	return c.Status
}

// packages names what the guest booted: the image package, and the
// packages holding its kernel and modules where it is a dependency package.
func (g *GuestLog) packages() string {
	if g.Plan.Package == "" {
		return "-"
	}
	s := g.Plan.Package + "=" + g.Plan.Version
	if len(g.Plan.Parts) > 0 {
		s += " (" + strings.Join(g.Plan.Parts, ", ") + ")"
	}
	return s
}

func hostField(g *GuestLog, f string) string {
	if g.Host == nil {
		return "-"
	}
	if f == "rc" {
		return strconv.Itoa(g.Host.RC)
	}
	return strconv.FormatFloat(g.Host.Seconds, 'f', 1, 64)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeFailedOutput prints the last lines of every failed cell's output,
// and the console's last lines of a guest that did not finish.
func (r *Report) writeFailedOutput(w io.Writer) {
	for _, g := range r.Guests {
		for _, c := range g.Cells {
			if c.Status != "fail" || strings.TrimSpace(strings.Join(c.Output, "")) == "" {
				continue
			}
			out := c.Output
			for len(out) > 0 && strings.TrimSpace(out[len(out)-1]) == "" {
				out = out[:len(out)-1]
			}
			if len(out) > failedTail {
				out = out[len(out)-failedTail:]
			}
			fmt.Fprintf(w, "\n--- %s %s %s failed (%s); its last %d lines:\n", c.Kernel, c.Tier, c.Suite, c.Note, len(out))
			for _, l := range out {
				fmt.Fprintf(w, "    %s\n", l)
			}
		}
		if !g.Done && len(g.Tail) > 0 {
			fmt.Fprintf(w, "\n--- %s did not finish (%s); the console's last %d lines:\n", dash(g.Plan.Guest), g.Note(), len(g.Tail))
			for _, l := range g.Tail {
				fmt.Fprintf(w, "    %s\n", l)
			}
		}
	}
}

// writeRuns prints the RUNS lines (TestRunsPerUnit) as tables, kernel and
// tier by case: the runs per unit, then (lines that carry times) the
// programs' time per unit, then each program's runs per unit at its time per
// run; nothing when no guest ran that suite.
func (r *Report) writeRuns(w io.Writer) {
	type row struct{ kernel, tier string }
	var rows []row
	var cases []string
	total := map[row]map[string]Runs{}
	timed, emulated := false, false
	for _, g := range r.Guests {
		for _, ru := range g.Runs {
			rw := row{ru.Kernel, ru.Tier}
			if total[rw] == nil {
				rows = append(rows, rw)
				total[rw] = map[string]Runs{}
			}
			if !slices.Contains(cases, ru.Case) {
				cases = append(cases, ru.Case)
			}
			total[rw][ru.Case] = ru
			timed = timed || ru.NsPerUnit != ""
			emulated = emulated || ru.Accel == "tcg"
		}
	}
	if len(rows) == 0 {
		return
	}
	table := func(title string, cell func(Runs) string) {
		fmt.Fprintf(w, "\n%s\n", title)
		fmt.Fprintf(w, "%-11s %-11s", "kernel", "tier")
		for _, c := range cases {
			fmt.Fprintf(w, " %13s", c)
		}
		fmt.Fprintln(w)
		for _, rw := range rows {
			fmt.Fprintf(w, "%-11s %-11s", rw.kernel, rw.tier)
			for _, c := range cases {
				v := "-"
				if ru, ok := total[rw][c]; ok && cell(ru) != "" {
					v = cell(ru)
				}
				fmt.Fprintf(w, " %13s", v)
			}
			fmt.Fprintln(w)
		}
	}
	table("BPF program runs per unit (runs suite, TestRunsPerUnit: per packet sent, answered query or loop)",
		func(ru Runs) string { return ru.Total })
	if timed {
		note := "this machine's time"
		if emulated {
			note = "in guests under qemu TCG emulation the emulator's time, not a measurement of any hardware"
		}
		table("BPF programs' time per unit, ns (run_time_ns, the statistics' clock reads included; "+note+")",
			func(ru Runs) string { return ru.NsPerUnit })
	}
	for _, rw := range rows {
		for _, c := range cases {
			ru, ok := total[rw][c]
			if !ok {
				continue
			}
			var d []string
			for _, p := range ru.Progs {
				_, v, _ := strings.Cut(p, "=")
				v, _, _ = strings.Cut(v, "@")
				if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 0.005 {
					d = append(d, p)
				}
			}
			if len(d) > 0 {
				fmt.Fprintf(w, "  %s %s %s: %s\n", rw.kernel, rw.tier, c, strings.Join(d, " "))
			}
		}
	}
}

// JSON is the matrix as DNSRACE_VMTEST_MATRIX_OUT writes it.
type JSON struct {
	TotalSeconds float64      `json:"total_seconds"`
	Kernels      []JSONKernel `json:"kernels"`
	Cells        []JSONCell   `json:"cells"`
}

// JSONKernel is one guest.
type JSONKernel struct {
	Kernel      string   `json:"kernel"`
	Arch        string   `json:"arch"`
	Tiers       []string `json:"tiers"`
	Package     string   `json:"package"`
	Version     string   `json:"version"`
	Parts       []string `json:"parts,omitempty"`
	Pin         string   `json:"pin"`
	Wanted      string   `json:"wanted"`
	Uname       string   `json:"uname"`
	BootSeconds *float64 `json:"boot_seconds"`
	WallSeconds *float64 `json:"wall_seconds"`
	QemuRC      *int     `json:"qemu_rc"`
	Note        string   `json:"note"`
	Crash       string   `json:"crash,omitempty"`
}

// JSONCell is one cell.
type JSONCell struct {
	Kernel      string   `json:"kernel"`
	Tier        string   `json:"tier"`
	Suite       string   `json:"suite"`
	Status      string   `json:"status"`
	Note        string   `json:"note"`
	FailedTests []string `json:"failed_tests"`
}

// WriteJSON writes the matrix as JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	j := JSON{TotalSeconds: r.TotalSeconds, Kernels: []JSONKernel{}, Cells: []JSONCell{}}
	for _, g := range r.Guests {
		k := JSONKernel{Kernel: g.Label(), Arch: g.Plan.Arch, Tiers: g.Plan.Tiers, Package: g.Plan.Package,
			Version: g.Plan.Version, Parts: g.Plan.Parts, Pin: g.Plan.Pin, Wanted: g.Plan.Wanted,
			Uname: g.Uname, Note: g.Note(), Crash: g.Crash}
		if f, err := strconv.ParseFloat(g.BootSeconds, 64); err == nil {
			k.BootSeconds = &f
		}
		if g.Host != nil {
			k.WallSeconds, k.QemuRC = &g.Host.Seconds, &g.Host.RC
		}
		j.Kernels = append(j.Kernels, k)
		for _, c := range g.Cells {
			ft := c.FailedTests
			if ft == nil {
				ft = []string{}
			}
			j.Cells = append(j.Cells, JSONCell{Kernel: c.Kernel, Tier: c.Tier, Suite: c.Suite, Status: c.Status, Note: c.Note, FailedTests: ft})
		}
	}
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	if err := e.Encode(j); err != nil {
		return fmt.Errorf("encoding the matrix: %w", err)
	}
	return nil
}
