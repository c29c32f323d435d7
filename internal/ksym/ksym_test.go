package ksym

import (
	"os"
	"strings"
	"testing"

	"github.com/dnsrace/dnsrace/internal/testutil"
)

func TestLookup(t *testing.T) {
	tab, err := Parse(strings.NewReader(`ffffffff81000000 T _stext
ffffffff81a00000 t nf_hook_slow
ffffffff81a00200 T nft_do_chain
ffffffff81b00000 D some_data
0000000000000000 T hidden
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := tab.Format(0xffffffff81a0009d); got != "nf_hook_slow+0x9d" {
		t.Errorf("got %q", got)
	}
	if got := tab.Format(0xffffffff81a00200); got != "nft_do_chain+0x0" {
		t.Errorf("got %q", got)
	}
	if got := tab.Format(0x10); got != "0x10" {
		t.Errorf("below every symbol: got %q", got)
	}
}

func TestLiveKallsyms(t *testing.T) {
	tab, err := Load("")
	if err != nil {
		testutil.SkipOrFail(t, err.Error())
	}
	if len(tab.syms) == 0 {
		if os.Geteuid() != 0 {
			t.Skip("kallsyms addresses hidden from non-root users")
		}
		testutil.SkipOrFail(t, "kallsyms addresses hidden from root (kptr_restrict=2?)")
	}
	for _, s := range tab.syms {
		if s.name == "nf_hook_slow" {
			if got, _, _ := tab.Lookup(s.addr + 1); got != "nf_hook_slow" {
				t.Errorf("nf_hook_slow+1 resolved to %q", got)
			}
			return
		}
	}
	t.Error("nf_hook_slow not in /proc/kallsyms")
}
