package clashfix

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/cilium/ebpf/btf"
)

// Version is the numeric prefix of a kernel release ("5.15.0-1052-azure" is
// 5.15.0).
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// AtLeast reports whether v >= major.minor.
func (v Version) AtLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

// ParseRelease reads the leading "MAJOR.MINOR[.PATCH]" of a uname -r string.
func ParseRelease(rel string) (Version, error) {
	rel = strings.TrimSpace(rel)
	end := 0
	for end < len(rel) && (rel[end] == '.' || (rel[end] >= '0' && rel[end] <= '9')) {
		end++
	}
	parts := strings.Split(strings.Trim(rel[:end], "."), ".")
	if len(parts) < 2 {
		return Version{}, fmt.Errorf("parsing kernel release %q: want MAJOR.MINOR", rel)
	}
	var nums [3]int
	for i := 0; i < len(parts) && i < 3; i++ {
		n, err := strconv.Atoi(parts[i])
		if err != nil || n > 1000 {
			return Version{}, fmt.Errorf("parsing kernel release %q: bad number %q", rel, parts[i])
		}
		nums[i] = n
	}
	if nums[0] < 2 || nums[0] > 99 {
		return Version{}, fmt.Errorf("parsing kernel release %q: implausible major %d", rel, nums[0])
	}
	return Version{nums[0], nums[1], nums[2]}, nil
}

// Facts are what Assess decides from. Zero values mean "not known".
type Facts struct {
	Release   string
	Version   Version
	VersionOK bool

	// BTFLoaded is set when some BTF (vmlinux or module) was read.
	BTFLoaded bool
	// StatusEnumSeen: enum ip_conntrack_status was found in BTF, so the
	// absence of IPS_NAT_CLASH_BIT is meaningful.
	StatusEnumSeen bool
	NATClashBit    bool // IPS_NAT_CLASH_BIT in enum ip_conntrack_status (5.6+)
	// StatsEnumSeen: enum ctattr_stats_cpu was found.
	StatsEnumSeen    bool
	ClashResolveStat bool // CTA_STATS_CLASH_RESOLVE (5.10+)
	ChainTooLongStat bool // CTA_STATS_CHAIN_TOOLONG (5.15+)
	// ResolveClashParams is the parameter count of nf_ct_resolve_clash in
	// BTF: 3 on 5.6+ (skb, h, reply_hash), 4 before; 0 when absent.
	ResolveClashParams int
	UsedTupleNewBTF    bool // FUNC nf_nat_used_tuple_new (6.12+, static noinline)

	KallsymsRead       bool
	KsymResolveClash   bool // nf_ct_resolve_clash out of line (noinline since 5.5)
	KsymUsedTupleNew   bool // nf_nat_used_tuple_new (6.12+)
	KsymConntrackConfm bool // __nf_conntrack_confirm
}

// SetRelease fills Release and Version from a uname -r string.
func (f *Facts) SetRelease(rel string) error {
	f.Release = strings.TrimSpace(rel)
	v, err := ParseRelease(rel)
	if err != nil {
		return err
	}
	f.Version, f.VersionOK = v, true
	return nil
}

// ProbeBTF records the conntrack facts found in spec (vmlinux BTF, or a
// module's split BTF such as /sys/kernel/btf/nf_conntrack). Calling it for
// several specs ORs their facts.
func (f *Facts) ProbeBTF(spec *btf.Spec) {
	if spec == nil {
		return
	}
	f.BTFLoaded = true
	var st *btf.Enum
	if err := spec.TypeByName("ip_conntrack_status", &st); err == nil {
		f.StatusEnumSeen = true
		for _, v := range st.Values {
			if v.Name == "IPS_NAT_CLASH_BIT" || v.Name == "IPS_NAT_CLASH" {
				f.NATClashBit = true
			}
		}
	}
	var stats *btf.Enum
	if err := spec.TypeByName("ctattr_stats_cpu", &stats); err == nil {
		f.StatsEnumSeen = true
		for _, v := range stats.Values {
			switch v.Name {
			case "CTA_STATS_CLASH_RESOLVE":
				f.ClashResolveStat = true
			case "CTA_STATS_CHAIN_TOOLONG":
				f.ChainTooLongStat = true
			}
		}
	}
	var fn *btf.Func
	if err := spec.TypeByName("nf_ct_resolve_clash", &fn); err == nil {
		if proto, ok := fn.Type.(*btf.FuncProto); ok {
			f.ResolveClashParams = len(proto.Params)
		}
	}
	var used *btf.Func
	if err := spec.TypeByName("nf_nat_used_tuple_new", &used); err == nil {
		f.UsedTupleNewBTF = true
	}
}

// ScanKallsyms records which of the clash-resolution functions exist out of
// line, from /proc/kallsyms text ("ADDR TYPE NAME [MODULE]"). Compiler
// suffixes (.isra.0, .constprop.0, .cold) are stripped.
func (f *Facts) ScanKallsyms(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	lines := 0
	for sc.Scan() {
		lines++
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 {
			continue
		}
		name := fields[2]
		if i := strings.IndexByte(name, '.'); i > 0 {
			name = name[:i]
		}
		switch name {
		case "nf_ct_resolve_clash":
			f.KsymResolveClash = true
		case "nf_nat_used_tuple_new":
			f.KsymUsedTupleNew = true
		case "__nf_conntrack_confirm":
			f.KsymConntrackConfm = true
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("scanning kallsyms: %w", err)
	}
	if lines == 0 {
		return errors.New("scanning kallsyms: file is empty")
	}
	f.KallsymsRead = true
	return nil
}

// Class is one kind of conntrack insertion race.
type Class int

const (
	SameTupleNoNAT Class = iota
	SameTupleSameDNAT
	SameTupleDiffDNAT
	ReverseCollision
	SNATReplyClash
)

var classNames = [...]string{
	SameTupleNoNAT:    "identical 5-tuple, no NAT",
	SameTupleSameDNAT: "same 5-tuple, same DNAT backend",
	SameTupleDiffDNAT: "same 5-tuple, different DNAT backends (random DNAT, kube-dns VIP)",
	ReverseCollision:  "reverse collision (a:b->c:d vs c:d->a:b)",
	SNATReplyClash:    "different tuples, same SNAT reply tuple (port clash)",
}

func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", int(c))
}

// ClassResult is the kernel's handling of one class.
type ClassResult struct {
	Class    Class
	Resolved bool
	Outcome  string // "merged", "inserted reply-only (IPS_NAT_CLASH, 1 s)", "drop", ...
	Basis    string // why we think so
	Since    string // the release that fixed it upstream, "" for never
}

// Assessment is Assess's answer.
type Assessment struct {
	Classes []ClassResult
	// Notes are facts worth showing that do not change a class verdict
	// (counter availability, attachability).
	Notes []string
}

// Drops returns the classes that still drop a packet.
func (a Assessment) Drops() []ClassResult {
	var out []ClassResult
	for _, c := range a.Classes {
		if !c.Resolved {
			out = append(out, c)
		}
	}
	return out
}

// Class returns the result for c.
func (a Assessment) Class(c Class) ClassResult {
	for _, r := range a.Classes {
		if r.Class == c {
			return r
		}
	}
	return ClassResult{Class: c}
}

// Assess classifies the kernel described by f. See the package comment.
func Assess(f Facts) Assessment {
	var a Assessment
	v := f.Version
	rel := func(maj, min int) (bool, string) {
		if !f.VersionOK {
			return false, "release unknown"
		}
		if v.AtLeast(maj, min) {
			return true, fmt.Sprintf("release %d.%d >= %d.%d", v.Major, v.Minor, maj, min)
		}
		return false, fmt.Sprintf("release %d.%d < %d.%d", v.Major, v.Minor, maj, min)
	}

	// Different DNAT backends: 6a757c07e51f (5.6).
	diff := ClassResult{Class: SameTupleDiffDNAT, Since: "5.6", Outcome: "drop (insert_failed+drop)"}
	switch {
	case f.NATClashBit:
		diff.Resolved, diff.Basis = true, "BTF: enum ip_conntrack_status has IPS_NAT_CLASH_BIT"
	case f.ResolveClashParams == 3:
		diff.Resolved, diff.Basis = true, "BTF: nf_ct_resolve_clash(skb, h, reply_hash) has the 5.6 signature"
	case f.StatusEnumSeen:
		diff.Basis = "BTF: enum ip_conntrack_status has no IPS_NAT_CLASH_BIT"
		if ok, why := rel(5, 6); ok {
			diff.Basis += " (although " + why + ")"
		}
	default:
		diff.Resolved, diff.Basis = rel(5, 6)
	}
	if diff.Resolved {
		diff.Outcome = "inserted reply-only (IPS_NAT_CLASH, 1 s)"
	}

	// Same DNAT result: ed07d9a021df (4.19) + 4e35c1cb9460 (5.0).
	same := ClassResult{Class: SameTupleSameDNAT, Since: "5.0", Outcome: "drop (insert_failed+drop)"}
	switch ok, why := rel(5, 0); {
	case diff.Resolved && diff.Basis != "" && !strings.HasPrefix(diff.Basis, "release"):
		same.Resolved, same.Outcome, same.Basis = true, "merged", "implied by the 5.6 clash code ("+diff.Basis+")"
	case ok:
		same.Resolved, same.Outcome, same.Basis = true, "merged", why
	case f.VersionOK && v.AtLeast(4, 19):
		same.Outcome, same.Basis = "merged only if the SNAT reply tuples match, else drop", "release 4.19 has ed07d9a021df but not 4e35c1cb9460 (5.0)"
	default:
		same.Basis = why
	}

	// No NAT: 71d8c47fc653 (believed 4.6).
	nonat := ClassResult{Class: SameTupleNoNAT, Since: "4.6", Outcome: "drop (insert_failed+drop)"}
	switch ok, why := rel(4, 6); {
	case f.KsymResolveClash || f.ResolveClashParams > 0:
		nonat.Resolved, nonat.Outcome, nonat.Basis = true, "merged", "nf_ct_resolve_clash exists (BTF/kallsyms)"
	case same.Resolved:
		nonat.Resolved, nonat.Outcome, nonat.Basis = true, "merged", "implied: "+same.Basis
	case ok:
		nonat.Resolved, nonat.Outcome, nonat.Basis = true, "merged", why
	default:
		nonat.Basis = why
	}

	// Reverse collisions: a4e6a1031e77 (6.12).
	rev := ClassResult{Class: ReverseCollision, Since: "6.12", Outcome: "drop (insert_failed+drop)"}
	switch ok, why := rel(6, 12); {
	case f.UsedTupleNewBTF:
		rev.Resolved, rev.Basis = true, "BTF: nf_nat_used_tuple_new exists (6.12 reverse-collision series)"
	case f.KsymUsedTupleNew:
		rev.Resolved, rev.Basis = true, "kallsyms: nf_nat_used_tuple_new exists (6.12 reverse-collision series)"
	default:
		rev.Resolved, rev.Basis = ok, why
	}
	if rev.Resolved {
		rev.Outcome = "merged"
	}

	snat := ClassResult{Class: SNATReplyClash, Outcome: "drop (insert_failed+drop) on every kernel",
		Basis: "no kernel resolves a reply-direction clash: nf_ct_resolve_clash_harder (6a757c07e51f) inserts only original-direction clashes (docs/kernel.md §3); --random-fully only lowers the odds"}

	a.Classes = []ClassResult{nonat, same, diff, rev, snat}

	switch {
	case f.ClashResolveStat:
		a.Notes = append(a.Notes, "clash_resolve counter available (CTA_STATS_CLASH_RESOLVE, 5.10+)")
	case f.StatsEnumSeen:
		a.Notes = append(a.Notes, "no clash_resolve counter (before 5.10): resolved races only show in insert_failed on older kernels")
	}
	if f.ChainTooLongStat {
		a.Notes = append(a.Notes, "chaintoolong counter available (5.15+)")
	}
	if f.KallsymsRead {
		if f.KsymResolveClash {
			a.Notes = append(a.Notes, "kallsyms: nf_ct_resolve_clash is out of line (attachable)")
		} else {
			a.Notes = append(a.Notes, "kallsyms: no nf_ct_resolve_clash symbol (inlined, before 5.5, or conntrack not loaded)")
		}
	}
	return a
}
