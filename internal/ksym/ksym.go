package ksym

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

type sym struct {
	addr uint64
	name string
}

// Table is a sorted symbol table.
type Table struct{ syms []sym }

// Load reads /proc/kallsyms (or path). Addresses read as zero when the
// caller lacks privileges (kptr_restrict); Load then returns an empty table.
func Load(path string) (*Table, error) {
	if path == "" {
		path = "/proc/kallsyms"
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading kernel symbols: %w", err)
	}
	defer f.Close()
	return Parse(f)
}

// Parse reads kallsyms-format text.
func Parse(r io.Reader) (*Table, error) {
	t := &Table{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			continue
		}
		if typ := f[1]; typ != "t" && typ != "T" {
			continue
		}
		a, err := strconv.ParseUint(f[0], 16, 64)
		if err != nil || a == 0 {
			continue
		}
		t.syms = append(t.syms, sym{a, f[2]})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	sort.Slice(t.syms, func(i, j int) bool { return t.syms[i].addr < t.syms[j].addr })
	return t, nil
}

// Lookup returns the function containing addr and the offset into it.
func (t *Table) Lookup(addr uint64) (string, uint64, bool) {
	if t == nil || addr == 0 {
		return "", 0, false
	}
	i := sort.Search(len(t.syms), func(i int) bool { return t.syms[i].addr > addr }) - 1
	if i < 0 {
		return "", 0, false
	}
	return t.syms[i].name, addr - t.syms[i].addr, true
}

// Format returns "name+0xoff", or the bare address when unknown.
func (t *Table) Format(addr uint64) string {
	if name, off, ok := t.Lookup(addr); ok {
		return fmt.Sprintf("%s+0x%x", name, off)
	}
	if addr == 0 {
		return ""
	}
	return fmt.Sprintf("0x%x", addr)
}

// Range returns where function name starts and where the next symbol
// starts (its end, for a function followed by another).
func (t *Table) Range(name string) (start, end uint64, ok bool) {
	if t == nil {
		return 0, 0, false
	}
	for i, s := range t.syms {
		if s.name == name && i+1 < len(t.syms) {
			return s.addr, t.syms[i+1].addr, true
		}
	}
	return 0, 0, false
}
