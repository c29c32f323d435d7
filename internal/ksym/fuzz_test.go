package ksym

import (
	"os"
	"sort"
	"strings"
	"testing"
)

// FuzzParse: any /proc/kallsyms text parses to a table sorted by address
// that answers every symbol's own address with a symbol at that address
// and offset 0, every address between two symbols with the lower one and
// the distance, and formats any address without panicking.
func FuzzParse(f *testing.F) {
	f.Add([]byte("ffffffff81000000 T _stext\nffffffff81a00000 t nf_hook_slow\nffffffff81a00200 T nft_do_chain\t[nf_tables]\nffffffff81b00000 D some_data\n0000000000000000 T hidden\n"))
	f.Add([]byte("ffffffff81a00000 t a\nffffffff81a00000 t b\nffffffffffffffff T last\n0000000000000001 t first\n"))
	f.Add([]byte("zz t bad\n1 t\n10000000000000000 T overflow\n"))
	if fh, err := os.Open("/proc/kallsyms"); err == nil {
		b := make([]byte, 64<<10)
		n, _ := fh.Read(b)
		fh.Close()
		f.Add(b[:n])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tab, err := Parse(strings.NewReader(string(data)))
		if err != nil {
			return
		}
		if !sort.SliceIsSorted(tab.syms, func(i, j int) bool { return tab.syms[i].addr < tab.syms[j].addr }) {
			t.Fatal("table not sorted")
		}
		for i, s := range tab.syms {
			if s.addr == 0 || s.name == "" {
				t.Fatalf("symbol %+v", s)
			}
			name, off, ok := tab.Lookup(s.addr)
			if !ok || off != 0 {
				t.Fatalf("Lookup(%#x) = %q+%#x %v", s.addr, name, off, ok)
			}
			if j := sort.Search(len(tab.syms), func(j int) bool { return tab.syms[j].addr > s.addr }) - 1; tab.syms[j].name != name {
				t.Fatalf("Lookup(%#x) = %q, the last symbol there is %q", s.addr, name, tab.syms[j].name)
			}
			if i+1 < len(tab.syms) && tab.syms[i+1].addr > s.addr+1 {
				if n, off, _ := tab.Lookup(s.addr + 1); off != 1 || n != name {
					t.Fatalf("Lookup(%#x+1) = %q+%#x, want %q+0x1", s.addr, n, off, name)
				}
			}
			if got := tab.Format(s.addr); got != name+"+0x0" {
				t.Fatalf("Format(%#x) = %q", s.addr, got)
			}
		}
		if len(tab.syms) > 0 && tab.syms[0].addr > 1 {
			if _, _, ok := tab.Lookup(tab.syms[0].addr - 1); ok {
				t.Fatal("an address below every symbol resolved")
			}
		}
		if tab.Format(0) != "" {
			t.Fatal("Format(0) is not empty")
		}
	})
}
