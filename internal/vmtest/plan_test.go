package vmtest

import (
	"os"
	"slices"
	"strings"
	"testing"
)

func repoKernels(t *testing.T) []Kernel {
	t.Helper()
	f, err := os.Open("../../scripts/kernels.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ks, err := ParseKernels(f)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func labels(ks []Kernel) []string {
	var l []string
	for _, k := range ks {
		l = append(l, k.Label)
	}
	return l
}

func TestKernelsSelect(t *testing.T) {
	ks := repoKernels(t)
	def, err := SelectKernels(ks, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"5.10", "6.1", "6.12", "7.2", "6.1-arm64", "6.12-arm64"}; !slices.Equal(labels(def), want) {
		t.Errorf("default kernels %v, want %v", labels(def), want)
	}
	full, _ := SelectKernels(ks, nil, true)
	if !slices.Contains(labels(full), "7.2-arm64") {
		t.Errorf("full kernels %v lack 7.2-arm64", labels(full))
	}
	// --only names a kernel of any scope
	only, err := SelectKernels(ks, []string{"7.2-arm64", "6.1"}, false)
	if err != nil || !slices.Equal(labels(only), []string{"6.1", "7.2-arm64"}) {
		t.Errorf("--only: %v, %v", labels(only), err)
	}
	if _, err := SelectKernels(ks, []string{"6.2"}, false); err == nil {
		t.Error("--only of an unknown label is no error")
	}
	k72 := ks[slices.IndexFunc(ks, func(k Kernel) bool { return k.Label == "7.2" })]
	if k72.Suite != "sid" || k72.Arch != "amd64" || k72.Package != "linux-image-7.2.13+deb14-cloud-amd64" {
		t.Errorf("7.2: %+v", k72)
	}
}

func TestKernelsErrors(t *testing.T) {
	for _, in := range []string{"6.1\n", "6.1 pkg arch=s390x\n", "6.1 pkg colour=red\n", "6.1 a\n6.1 b\n"} {
		if _, err := ParseKernels(strings.NewReader(in)); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

func repoSuites(t *testing.T) []SuiteLine {
	t.Helper()
	f, err := os.Open("../../scripts/vmtest.d/suites.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ss, err := ParseSuites(f)
	if err != nil {
		t.Fatal(err)
	}
	return ss
}

func suiteTiers(ss []Suite) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Name+":"+strings.Join(s.Tiers, "+"))
	}
	return out
}

func TestSuitesPlan(t *testing.T) {
	lines := repoSuites(t)
	def := SuitesFor(lines, "amd64", false, DefaultTiers, "")
	want := []string{"probe:fentry+kprobe+tracepoint", "trace:fentry", "realnodes:fentry", "traceone:kprobe+tracepoint", "lab:any", "tpchurn:any", "runs:fentry+kprobe+tracepoint"}
	if got := suiteTiers(def); !slices.Equal(got, want) {
		t.Errorf("default suites %v, want %v", got, want)
	}
	// arm64 guests have no dnsmasq: no realnodes
	full := SuitesFor(lines, "arm64", true, DefaultTiers, "")
	want = []string{"probe:fentry+kprobe+tracepoint", "trace:fentry+kprobe+tracepoint", "lab:any", "tpchurn:any", "runs:fentry+kprobe+tracepoint"}
	if got := suiteTiers(full); !slices.Equal(got, want) {
		t.Errorf("full suites %v, want %v", got, want)
	}
	// --tiers narrows "all"; DNSRACE_VMTEST_RUN replaces every pattern
	one := SuitesFor(lines, "amd64", false, []string{"kprobe"}, "TestX")
	if got := suiteTiers(one); got[0] != "probe:kprobe" || one[0].Pattern != "TestX" || one[0].Binary != "./internal/probe" {
		t.Errorf("--tiers kprobe: %v %+v", got, one[0])
	}
	// a run of one tier keeps the lines of that tier and the tier-less ones
	if got := suiteTiers(SuitesFor(lines, "amd64", false, []string{"fentry"}, "")); !slices.Equal(got, []string{"probe:fentry", "trace:fentry", "realnodes:fentry", "lab:any", "tpchurn:any", "runs:fentry"}) {
		t.Errorf("--tiers fentry: %v", got)
	}
	if got := PlanTiers(def, DefaultTiers); !slices.Equal(got, []string{"fentry", "kprobe", "tracepoint", "any"}) {
		t.Errorf("plan tiers %v", got)
	}
}

func TestSpec(t *testing.T) {
	for _, c := range []struct {
		spec, name, bin, pattern, tiers string
	}{
		{"/tmp/probe.test", "probe", "/tmp/probe.test", ".", "fentry+kprobe+tracepoint"},
		{"p=/tmp/probe.test:TestForcedTier", "p", "/tmp/probe.test", "TestForcedTier", "fentry+kprobe+tracepoint"},
		{"/tmp/x/lab.test:TestSmokeGetent@any", "lab", "/tmp/x/lab.test", "TestSmokeGetent", "any"},
		{"/tmp/probe.test:A|B@kprobe,tracepoint", "probe", "/tmp/probe.test", "A|B", "kprobe+tracepoint"},
		{"./a=b/t.test", "t", "./a=b/t.test", ".", "fentry+kprobe+tracepoint"},
	} {
		s, err := ParseSpec(c.spec, DefaultTiers)
		if err != nil {
			t.Errorf("%s: %v", c.spec, err)
			continue
		}
		if s.Name != c.name || s.Binary != c.bin || s.Pattern != c.pattern || strings.Join(s.Tiers, "+") != c.tiers {
			t.Errorf("%s: %+v", c.spec, s)
		}
	}
	for _, bad := range []string{"/tmp/p.test:A B", "/tmp/p.test@Fentry", "n!=/tmp/p.test", ":x"} {
		if _, err := ParseSpec(bad, DefaultTiers); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func TestSplitAndBootOrder(t *testing.T) {
	plan := []string{"fentry", "kprobe", "tracepoint", "any"}
	for _, c := range []struct {
		split string
		want  string
	}{
		{DefaultSplit, "fentry kprobe,tracepoint,any"},
		{"fentry kprobe tracepoint,any", "fentry kprobe tracepoint,any"},
		{"all", "fentry,kprobe,tracepoint,any"},
		{"fentry", "fentry kprobe,tracepoint,any"}, // the tiers in no group: one more guest
	} {
		var got []string
		for _, g := range SplitTiers(plan, c.split) {
			got = append(got, strings.Join(g, ","))
		}
		if strings.Join(got, " ") != c.want {
			t.Errorf("--split %q: %v, want %s", c.split, got, c.want)
		}
	}
	// a run of one tier is one guest, named by its label alone
	ks := []Kernel{{Label: "6.1", Arch: "amd64"}, {Label: "7.2", Arch: "amd64"}, {Label: "6.1-arm64", Arch: "arm64"}}
	gs := Guests(ks, map[string][]string{"amd64": {"kprobe"}, "arm64": {"kprobe"}}, DefaultSplit)
	var names []string
	for _, g := range gs {
		names = append(names, g.Name)
	}
	if !slices.Equal(names, []string{"6.1-arm64", "6.1", "7.2"}) {
		t.Errorf("one tier: guests %v", names)
	}
	// group by group, arm64 first in each
	gs = Guests(ks, map[string][]string{"amd64": plan, "arm64": plan}, DefaultSplit)
	names = nil
	for _, g := range gs {
		names = append(names, g.Name)
	}
	want := []string{"6.1-arm64@fentry", "6.1@fentry", "7.2@fentry", "6.1-arm64@kprobe+tracepoint+any", "6.1@kprobe+tracepoint+any", "7.2@kprobe+tracepoint+any"}
	if !slices.Equal(names, want) {
		t.Errorf("boot order %v, want %v", names, want)
	}
}

func TestSuiteKernels(t *testing.T) {
	lines, err := ParseSuites(strings.NewReader("a ./a . fentry amd64,6.12,7.2\nb ./b . fentry 7.2\nc ./c . fentry\n"))
	if err != nil {
		t.Fatal(err)
	}
	amd := SuitesFor(lines, "amd64", false, DefaultTiers, "")
	arm := SuitesFor(lines, "arm64", false, DefaultTiers, "")
	if len(amd) != 3 || len(arm) != 2 {
		t.Fatalf("%d amd64 and %d arm64 suites, want 3 and 2 (a is amd64's)", len(amd), len(arm))
	}
	for _, c := range []struct {
		suite, kernel string
		runs          bool
	}{{"a", "6.12", true}, {"a", "6.1", false}, {"b", "7.2", true}, {"b", "6.12-arm64", false}, {"c", "5.10", true}} {
		for _, s := range append(amd, arm...) {
			if s.Name == c.suite && s.RunsOn(c.kernel) != c.runs {
				t.Errorf("suite %s on %s: runs %v, want %v", c.suite, c.kernel, !c.runs, c.runs)
			}
		}
	}
	if got := guestArgs([]string{"fentry"}, []string{"a", "b"}); got != "vmtest.tiers=fentry vmtest.skip=a,b" {
		t.Errorf("guestArgs: %q", got)
	}
}
