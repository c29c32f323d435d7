package clashfix

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/dnsrace/dnsrace/internal/testutil"
)

func TestParseRelease(t *testing.T) {
	for in, want := range map[string]Version{
		"6.18.44-fc-v669":          {6, 18, 44},
		"5.15.0-1052-azure\n":      {5, 15, 0},
		"4.15.0-1030-azure":        {4, 15, 0},
		"6.1":                      {6, 1, 0},
		"7.2.13+deb14-cloud-amd64": {7, 2, 13},
		"5.4.0-rc3":                {5, 4, 0},
		"3.10.0-1160.el7.x86_64":   {3, 10, 0},
	} {
		got, err := ParseRelease(in)
		if err != nil || got != want {
			t.Errorf("ParseRelease(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "linux", "6", "x.y", "0.1", "99999.1"} {
		if _, err := ParseRelease(bad); err == nil {
			t.Errorf("ParseRelease(%q): want error", bad)
		}
	}
}

func TestAssessByRelease(t *testing.T) {
	for _, tc := range []struct {
		rel        string
		drops      []Class
		resolvedOK []Class
	}{
		{"4.4.0", []Class{SameTupleNoNAT, SameTupleSameDNAT, SameTupleDiffDNAT, ReverseCollision, SNATReplyClash}, nil},
		{"4.15.0-1030-azure", []Class{SameTupleSameDNAT, SameTupleDiffDNAT, ReverseCollision, SNATReplyClash}, []Class{SameTupleNoNAT}},
		{"5.4.0", []Class{SameTupleDiffDNAT, ReverseCollision, SNATReplyClash}, []Class{SameTupleNoNAT, SameTupleSameDNAT}},
		{"5.15.0", []Class{ReverseCollision, SNATReplyClash}, []Class{SameTupleDiffDNAT}},
		{"6.12.5", []Class{SNATReplyClash}, []Class{ReverseCollision, SameTupleDiffDNAT}},
		// measured by the lab on Debian's 7.2 (docs/survey/7.2-vm.json)
		{"7.2.13+deb14-cloud-amd64", []Class{SNATReplyClash}, []Class{ReverseCollision, SameTupleDiffDNAT, SameTupleSameDNAT, SameTupleNoNAT}},
	} {
		var f Facts
		if err := f.SetRelease(tc.rel); err != nil {
			t.Fatal(err)
		}
		a := Assess(f)
		var got []Class
		for _, c := range a.Drops() {
			got = append(got, c.Class)
		}
		if len(got) != len(tc.drops) {
			t.Errorf("%s: drops %v, want %v", tc.rel, got, tc.drops)
			continue
		}
		for i := range got {
			if got[i] != tc.drops[i] {
				t.Errorf("%s: drops %v, want %v", tc.rel, got, tc.drops)
			}
		}
		for _, c := range tc.resolvedOK {
			if !a.Class(c).Resolved {
				t.Errorf("%s: %v not resolved", tc.rel, c)
			}
		}
	}
}

// A 4.15 distribution kernel whose BTF shows the 5.6 clash code (a backport)
// must be classified by BTF, not by its release number.
func TestAssessBTFWinsOverRelease(t *testing.T) {
	status := &btf.Enum{Name: "ip_conntrack_status", Size: 4, Values: []btf.EnumValue{
		{Name: "IPS_EXPECTED_BIT", Value: 0}, {Name: "IPS_NAT_CLASH_BIT", Value: 12},
	}}
	b, err := btf.NewBuilder([]btf.Type{status}, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := b.Marshal(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := btf.LoadSpecFromReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	var f Facts
	_ = f.SetRelease("4.15.0-1030-azure")
	f.ProbeBTF(spec)
	a := Assess(f)
	d := a.Class(SameTupleDiffDNAT)
	if !d.Resolved || !strings.Contains(d.Basis, "IPS_NAT_CLASH_BIT") {
		t.Errorf("diff DNAT = %+v, want resolved by BTF", d)
	}
	if !a.Class(SameTupleSameDNAT).Resolved {
		t.Errorf("same DNAT not resolved although the 5.6 code is present")
	}

	// And the other way round: a 5.10 release whose BTF lacks the bit.
	empty := &btf.Enum{Name: "ip_conntrack_status", Size: 4, Values: []btf.EnumValue{{Name: "IPS_EXPECTED_BIT"}}}
	b, _ = btf.NewBuilder([]btf.Type{empty}, nil)
	raw, _ = b.Marshal(nil, nil)
	spec, err = btf.LoadSpecFromReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	f = Facts{}
	_ = f.SetRelease("5.10.0")
	f.ProbeBTF(spec)
	if d := Assess(f).Class(SameTupleDiffDNAT); d.Resolved || !strings.Contains(d.Basis, "no IPS_NAT_CLASH_BIT") {
		t.Errorf("diff DNAT = %+v, want unresolved by BTF", d)
	}
}

func TestScanKallsyms(t *testing.T) {
	var f Facts
	in := "ffffffff81240fc0 t __nf_ct_resolve_clash\nffffffff812411f0 t nf_ct_resolve_clash.isra.0\n" +
		"ffffffff81f37be0 T __nf_conntrack_confirm\nffffffff81f5a8c0 t nf_nat_used_tuple_new\tnf_nat\n"
	if err := f.ScanKallsyms(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	if !f.KsymResolveClash || !f.KsymUsedTupleNew || !f.KsymConntrackConfm {
		t.Errorf("facts %+v", f)
	}
	if err := (&Facts{}).ScanKallsyms(strings.NewReader("")); err == nil {
		t.Error("empty kallsyms: want error")
	}
}

// The running kernel's own BTF: this project's machines run 6.18, where every
// class but the SNAT reply clash is resolved.
func TestAssessRunningKernel(t *testing.T) {
	spec, err := btf.LoadSpec("/sys/kernel/btf/vmlinux")
	if err != nil {
		testutil.SkipOrFail(t, fmt.Sprintf("no vmlinux BTF: %v", err))
	}
	rel, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	var f Facts
	if err := f.SetRelease(string(rel)); err != nil {
		t.Fatal(err)
	}
	f.ProbeBTF(spec)
	if !f.StatusEnumSeen {
		t.Fatal("enum ip_conntrack_status not in vmlinux BTF")
	}
	if f.Version.AtLeast(5, 6) != f.NATClashBit {
		t.Errorf("release %v but IPS_NAT_CLASH_BIT=%v", f.Version, f.NATClashBit)
	}
	a := Assess(f)
	for _, c := range a.Classes {
		t.Logf("%-70v resolved=%v outcome=%s basis=%s", c.Class, c.Resolved, c.Outcome, c.Basis)
	}
}
