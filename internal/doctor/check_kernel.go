package doctor

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf/btf"

	"github.com/dnsrace/dnsrace/internal/clashfix"
)

// loadVmlinuxBTF reads the node's vmlinux BTF, if any.
func (e *env) loadVmlinuxBTF() (*btf.Spec, error) {
	real, _, err := resolveIn(e.Root, "/sys/kernel/btf/vmlinux")
	if err != nil {
		return nil, err
	}
	spec, err := btf.LoadSpec(real)
	if err != nil {
		return nil, fmt.Errorf("loading /sys/kernel/btf/vmlinux: %w", unwrapPathErr(err))
	}
	return spec, nil
}

// checkKernel: which conntrack insertion-race classes does the running
// kernel resolve, and which still drop a packet (and so cost a 5 s retry)?
func checkKernel(_ context.Context, e *env) Result {
	var r Result
	var f clashfix.Facts
	var probs problems

	var relErr error
	if b, _, err := e.read("/proc/sys/kernel/osrelease"); err != nil {
		relErr = err
	} else if err := f.SetRelease(string(b)); err != nil {
		relErr = fmt.Errorf("/proc/sys/kernel/osrelease: %w", err)
	} else {
		r.Evidence = append(r.Evidence, "/proc/sys/kernel/osrelease: "+f.Release)
	}

	vmlinux, err := e.loadVmlinuxBTF()
	switch {
	case err == nil:
		f.ProbeBTF(vmlinux)
		r.Evidence = append(r.Evidence, "/sys/kernel/btf/vmlinux: loaded")
		for _, mod := range []string{"nf_conntrack", "nf_nat"} {
			p := "/sys/kernel/btf/" + mod
			real, _, rerr := resolveIn(e.Root, p)
			if rerr != nil {
				continue
			}
			if _, serr := os.Stat(real); serr != nil {
				continue
			}
			ms, merr := btf.LoadSplitSpec(real, vmlinux)
			if merr != nil {
				r.Evidence = append(r.Evidence, fmt.Sprintf("%s: unreadable (%v)", p, merr))
				continue
			}
			f.ProbeBTF(ms)
			r.Evidence = append(r.Evidence, p+": loaded (module BTF)")
		}
	case os.IsNotExist(err) || strings.Contains(err.Error(), "no such file"):
		r.Evidence = append(r.Evidence, "/sys/kernel/btf/vmlinux: absent, classifying by release only")
	default:
		r.Evidence = append(r.Evidence, fmt.Sprintf("/sys/kernel/btf/vmlinux: %v", err))
	}

	if real, _, err := resolveIn(e.Root, "/proc/kallsyms"); err == nil {
		if fh, err := os.Open(real); err == nil {
			if err := f.ScanKallsyms(fh); err != nil {
				r.Evidence = append(r.Evidence, "/proc/kallsyms: "+err.Error())
			}
			fh.Close()
		}
	}

	if relErr != nil {
		// BTF can still prove a fail, but the classes BTF does not cover
		// (reverse collisions) would be guessed: no ok without a release.
		probs.addf("%v", relErr)
	}
	if !f.VersionOK && !f.StatusEnumSeen {
		return Result{Verdict: Skip, Reason: strings.Join(append(probs, "neither a kernel release nor conntrack BTF to classify by"), "; "),
			Evidence: r.Evidence}
	}
	a := clashfix.Assess(f)
	var drops []string
	for _, c := range a.Classes {
		state := "resolved: " + c.Outcome
		if !c.Resolved {
			state = "DROPS: " + c.Outcome
			if c.Since != "" {
				state += ", fixed upstream in " + c.Since
			}
		}
		r.Evidence = append(r.Evidence, fmt.Sprintf("%s: %s [%s]", c.Class, state, c.Basis))
		if !c.Resolved {
			drops = append(drops, c.Class.String())
		}
	}
	r.Evidence = append(r.Evidence, a.Notes...)

	diff := a.Class(clashfix.SameTupleDiffDNAT)
	same := a.Class(clashfix.SameTupleSameDNAT)
	ver := f.Release
	if !f.VersionOK {
		ver = "this kernel"
	}
	switch {
	case !same.Resolved || !diff.Resolved:
		r.Verdict = Fail
		r.Summary = fmt.Sprintf("%s drops same-socket A/AAAA races through random DNAT (kube-dns VIP): %d race class(es) still drop", ver, len(drops))
		r.Fix = "upgrade to a kernel >= 5.6 (6a757c07e51f) or a distribution kernel with it backported; until then " +
			"`options single-request-reopen` (glibc only) or `use-vc` in the pods' dnsConfig, or NodeLocal DNSCache"
	default:
		r.Verdict = OK
		r.Summary = fmt.Sprintf("%s resolves the DNAT races; still drops: %s", ver, strings.Join(drops, "; "))
	}
	return probs.finish(r)
}
