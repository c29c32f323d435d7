package clashfix

import (
	"os"
	"strings"
	"testing"
)

// FuzzParseRelease: any uname -r string (from /proc/sys/kernel/osrelease
// of a node) parses to a plausible version or an error; a parsed version
// prints as MAJOR.MINOR.PATCH, which parses back to itself, with or without
// a distribution suffix; and Assess classifies it without panicking.
func FuzzParseRelease(f *testing.F) {
	for _, s := range []string{"6.18.44-fc-v669", "5.15.0-1052-azure\n", "4.15.0-1030-azure", "6.1", "5.4.0-rc3",
		"3.10.0-1160.el7.x86_64", "6.12.117+deb12-cloud-amd64", "6..1", "...", "4.19.0.", "010.001", "6.1.99999", " 6.1 "} {
		f.Add(s)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		f.Add(string(b))
	}
	f.Fuzz(func(t *testing.T, rel string) {
		v, err := ParseRelease(rel)
		if err != nil {
			return
		}
		if v.Major < 2 || v.Major > 99 || v.Minor < 0 || v.Minor > 1000 || v.Patch < 0 || v.Patch > 1000 {
			t.Fatalf("ParseRelease(%q) = %v: implausible", rel, v)
		}
		for _, s := range []string{v.String(), v.String() + "-1052-azure", v.String() + "+deb12-cloud-amd64"} {
			if again, err := ParseRelease(s); err != nil || again != v {
				t.Fatalf("ParseRelease(%q) = %v, %v; want %v (from %q)", s, again, err, v, rel)
			}
		}
		if !v.AtLeast(v.Major, v.Minor) || v.AtLeast(v.Major, v.Minor+1) {
			t.Fatalf("%v.AtLeast is wrong about itself", v)
		}
		var fa Facts
		if err := fa.SetRelease(rel); err != nil {
			t.Fatalf("SetRelease(%q): %v after ParseRelease took it", rel, err)
		}
		if a := Assess(fa); len(a.Classes) != 5 || a.Class(SNATReplyClash).Resolved {
			t.Fatalf("Assess(%v) = %+v", v, a)
		}
	})
}

// FuzzScanKallsyms: any /proc/kallsyms text scans without panicking, and
// scanning is a union: the facts of two texts joined are the facts of each
// ORed (every line is judged on its own).
func FuzzScanKallsyms(f *testing.F) {
	f.Add("ffffffff81f37a40 t nf_ct_resolve_clash\n", "ffffffff81f37be0 T __nf_conntrack_confirm\n")
	f.Add("ffffffffc0a01230 t nf_ct_resolve_clash.cold\t[nf_conntrack]\n", "ffffffff81f5a8c0 t nf_nat_used_tuple_new.isra.0\tnf_nat\n")
	f.Add("0000000000000000 T __nf_conntrack_confirm\n", "x\n\n  \n")
	f.Add(".nf_ct_resolve_clash t x\n", "a b .\n")
	f.Fuzz(func(t *testing.T, a, b string) {
		var fa, fb, fab Facts
		ea := fa.ScanKallsyms(strings.NewReader(a))
		eb := fb.ScanKallsyms(strings.NewReader(b))
		eab := fab.ScanKallsyms(strings.NewReader(a + "\n" + b))
		if (ea == nil) != fa.KallsymsRead || (eab == nil) != fab.KallsymsRead {
			t.Fatalf("KallsymsRead disagrees with the error: %v %v / %v %v", ea, fa.KallsymsRead, eab, fab.KallsymsRead)
		}
		if ea != nil || eb != nil || eab != nil {
			return // too long a line, or empty: nothing to compare
		}
		if fab.KsymResolveClash != (fa.KsymResolveClash || fb.KsymResolveClash) ||
			fab.KsymUsedTupleNew != (fa.KsymUsedTupleNew || fb.KsymUsedTupleNew) ||
			fab.KsymConntrackConfm != (fa.KsymConntrackConfm || fb.KsymConntrackConfm) {
			t.Fatalf("facts of %q+%q = %+v, not the union of %+v and %+v", a, b, fab, fa, fb)
		}
		if fa.KsymResolveClash && !strings.Contains(a, "nf_ct_resolve_clash") {
			t.Fatalf("nf_ct_resolve_clash found in %q", a)
		}
	})
}
