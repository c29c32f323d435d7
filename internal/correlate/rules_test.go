package correlate

import (
	"cmp"
	"go/parser"
	"go/token"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// docTable is one table of the package documentation: its header's
// column names and its rows, each a cell per column, continuation lines
// (indented two spaces more) joined to the row's first cell.
type docTable struct {
	header []string
	rows   [][]string
}

// docTables reads the tables of doc.go's package comment: blocks indented
// by a tab, columns aligned under the header's names.
func docTables(t *testing.T) map[string]docTable {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	if f.Doc == nil {
		t.Fatal("doc.go has no package comment")
	}
	tables := map[string]docTable{}
	var block []string
	flush := func() {
		if len(block) > 1 {
			tb := parseDocTable(t, block)
			tables[tb.header[0]] = tb
		}
		block = nil
	}
	for _, l := range strings.Split(f.Doc.Text(), "\n") {
		if strings.HasPrefix(l, "\t") {
			block = append(block, strings.TrimPrefix(l, "\t"))
			continue
		}
		flush()
	}
	flush()
	return tables
}

func parseDocTable(t *testing.T, lines []string) docTable {
	t.Helper()
	var tb docTable
	// The header's columns: names separated by two spaces or more.
	var cols []int
	h := lines[0]
	for i := 0; i < len(h); {
		if h[i] == ' ' {
			i++
			continue
		}
		j := strings.Index(h[i:], "  ")
		if j < 0 {
			j = len(h) - i
		}
		cols = append(cols, i)
		tb.header = append(tb.header, h[i:i+j])
		i += j
	}
	for _, l := range lines[1:] {
		if strings.HasPrefix(l, "  ") {
			if len(tb.rows) == 0 {
				t.Fatalf("doc.go table %q: a continuation line before any row: %q", tb.header[0], l)
			}
			r := tb.rows[len(tb.rows)-1]
			r[0] += " " + strings.TrimSpace(l)
			continue
		}
		row := make([]string, len(cols))
		for c, start := range cols {
			end := len(l)
			if c+1 < len(cols) {
				end = min(cols[c+1], len(l))
			}
			if start > len(l) {
				break
			}
			if start > 0 && l[start-1] != ' ' {
				t.Fatalf("doc.go table %q: %q is not aligned under the header's column %q", tb.header[0], l, tb.header[c])
			}
			row[c] = strings.TrimSpace(l[start:end])
		}
		tb.rows = append(tb.rows, row)
	}
	return tb
}

// words is s with its whitespace made single spaces.
func words(s string) string { return strings.Join(strings.Fields(s), " ") }

// identifiers are the words of s that name a reason or a function: those
// with an underscore.
func identifiers(s string) []string {
	// A reason without an underscore (OTHERHOST) is one some rule matches.
	known := map[string]bool{}
	for _, r := range rules {
		for _, n := range r.reasons {
			known[n] = true
		}
	}
	var ids []string
	for _, w := range strings.FieldsFunc(s, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '_' }) {
		if strings.Contains(w, "_") || known[w] {
			ids = append(ids, w)
		}
	}
	return ids
}

// TestDocTablesAreTheRules: doc.go's tables say the rules, row by row, in
// their order: a row's words are its rule's why, and its cause and kernel
// counters are the rule's. A row whose rule matches drop reasons or freeing
// functions names each of them, and only them.
func TestDocTablesAreTheRules(t *testing.T) {
	tables := docTables(t)

	causes, ok := tables["evidence"]
	if !ok {
		t.Fatalf("doc.go has no table of causes (header \"evidence  cause  kernel counters explained\"); tables: %v", tables)
	}
	if want := []string{"evidence", "cause", "kernel counters explained"}; !slices.Equal(causes.header, want) {
		t.Errorf("doc.go's table of causes has columns %q, want %q", causes.header, want)
	}
	if len(causes.rows) != len(rules) {
		t.Errorf("doc.go's table of causes has %d rows, rules.go %d", len(causes.rows), len(rules))
	}
	for i := range min(len(causes.rows), len(rules)) {
		row, r := causes.rows[i], &rules[i]
		if got := words(row[0]); got != words(r.why) {
			t.Errorf("row %d: doc.go says\n\t%q\nrules.go says\n\t%q", i+1, got, words(r.why))
		}
		if cause := cmp.Or(r.cause, "-"); row[1] != cause {
			t.Errorf("row %d (%s): doc.go's cause %q, rules.go's %q", i+1, r.why, row[1], cause)
		}
		var counters []string
		for _, c := range []struct {
			name string
			on   bool
		}{{"insert_failed", r.insertFailed}, {"drop", r.drop}, {"clash_resolve", r.clashResolve}} {
			if c.on {
				counters = append(counters, c.name)
			}
		}
		want := "-"
		if len(counters) > 0 {
			want = strings.Join(counters, ", ")
		}
		if row[2] != want {
			t.Errorf("row %d (%s): doc.go's counters %q, rules.go's %q", i+1, r.why, row[2], want)
		}
		if len(r.reasons)+len(r.symbols) > 0 {
			named := identifiers(r.why)
			listed := append(slices.Clone(r.reasons), r.symbols...)
			for _, n := range listed {
				if !slices.Contains(named, n) {
					t.Errorf("row %d (%s): matches %s but does not name it", i+1, r.why, n)
				}
			}
			for _, n := range named {
				if !slices.Contains(listed, n) {
					t.Errorf("row %d (%s): names %s but does not match it", i+1, r.why, n)
				}
			}
		}
	}
	// Every cause is named by a row.
	for _, c := range Causes {
		if !slices.ContainsFunc(rules, func(r rule) bool { return r.cause == c }) {
			t.Errorf("no rule names cause %s", c)
		}
	}

	races, ok := tables["winner"]
	if !ok {
		t.Fatal("doc.go has no table of races (header \"winner  race\")")
	}
	if len(races.rows) != len(raceRules) {
		t.Errorf("doc.go's table of races has %d rows, rules.go %d", len(races.rows), len(raceRules))
	}
	for i := range min(len(races.rows), len(raceRules)) {
		row, r := races.rows[i], raceRules[i]
		if got := words(row[0]); got != words(r.why) {
			t.Errorf("race row %d: doc.go says\n\t%q\nrules.go says\n\t%q", i+1, got, words(r.why))
		}
		want := r.race
		if want == "" {
			want = "-"
		}
		if row[1] != want {
			t.Errorf("race row %d (%s): doc.go's race %q, rules.go's %q", i+1, r.why, row[1], want)
		}
	}
}

// TestDocDefinesNetfilterDrops: the package doc says what a netfilter
// drop is in the terms evidence.netfilter reads.
func TestDocDefinesNetfilterDrops(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	doc := words(f.Doc.Text())
	i := strings.Index(doc, `"Dropped by netfilter" is`)
	if i < 0 {
		t.Fatal(`doc.go does not say what "dropped by netfilter" is`)
	}
	def := doc[i:]
	def = def[:strings.Index(def, ". ")]
	for _, n := range []string{netfilterReason, netfilterSymbol} {
		if !slices.Contains(identifiers(def), n) {
			t.Errorf("doc.go's definition %q does not name %s", def, n)
		}
	}
}

// TestEveryEvidenceHasARule: each kind of evidence ends with a row that
// matches all of it, so decide always finds one.
func TestEveryEvidenceHasARule(t *testing.T) {
	for s := seenQueryDrop; s <= seenRescue; s++ {
		last := -1
		for i, r := range rules {
			if r.seen == s {
				last = i
			}
		}
		if last < 0 {
			t.Errorf("no rule for evidence %d", s)
			continue
		}
		if r := rules[last]; r.when != nil || len(r.reasons)+len(r.symbols) > 0 {
			t.Errorf("the last rule for evidence %d (%s) does not match all of it", s, r.why)
		}
	}
}

// TestReasonNames: the rules read a drop reason only as an enum name; what
// Config.ReasonName gives for a value the kernel's enum lacks, or without
// drop reasons, is shown but names none.
func TestReasonNames(t *testing.T) {
	for _, c := range []struct {
		shown string
		name  string
		given bool
	}{
		{"NETFILTER_DROP", "NETFILTER_DROP", true},
		{"NOT_SPECIFIED", "NOT_SPECIFIED", false},
		{"reason(93)", "", false}, // probe.DropReasonName, a value the enum lacks
		{"", "", false},           // before 5.17
	} {
		c0 := New(Config{ReasonName: func(uint32) string { return c.shown }})
		r, shown := c0.reason(7)
		if r.value != 7 || r.name != c.name || r.given() != c.given || shown != c.shown {
			t.Errorf("ReasonName %q: reason %+v (given %v) shown %q; want name %q given %v", c.shown, r, r.given(), shown, c.name, c.given)
		}
	}
	r, shown := New(Config{}).reason(7)
	if r.name != "" || shown != "reason(7)" {
		t.Errorf("without ReasonName: reason %+v shown %q", r, shown)
	}
}
