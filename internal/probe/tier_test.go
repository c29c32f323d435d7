package probe

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// isFunctionHook reports whether hook is one of the function hooks (fentry
// or kprobe).
func isFunctionHook(hook string) bool {
	for _, h := range functionHooks {
		if h.name == hook {
			return true
		}
	}
	return false
}

// tierIndependent skips t in the VM matrix's fentry and kprobe cells: t
// forces no tier of its own (it opens the tiers it checks, or the automatic
// choice, or none), so one run per kernel says what three would, and the
// tracepoint cell of that kernel's guest runs it. Outside the matrix
// (DNSRACE_TEST_TIER empty) it always runs.
func tierIndependent(t *testing.T) {
	t.Helper()
	if tier := testTier(t); tier != event.TierTracepoint {
		t.Skipf("forces no tier: the VM matrix runs it in this kernel's tracepoint cell, not the %s cell", tier)
	}
}

// openTier opens a Tracer with the tier under test forced (opts.Attach).
// Where the kernel cannot give fentry (testutil.FentryLimit), the fentry
// case checks instead that
// forcing it is refused with a TierError naming a function hook, and that the
// automatic choice falls back to kprobe for the function hooks that need
// fentry's missing piece and says why; it returns that automatic tracer. The
// tests then expect each record in the tier its hook attached with.
func openTier(t *testing.T, opts Options) *Tracer {
	t.Helper()
	if opts.Attach != event.TierFentry {
		return open(t, opts)
	}
	limit := testutil.FentryLimit()
	if limit == "" {
		return open(t, opts)
	}
	t.Logf("fentry is limited here: %s", limit)
	tr, err := Open(opts)
	if err == nil {
		tr.Close()
		t.Fatalf("forced fentry attached although %s", limit)
	}
	var te *TierError
	if !errors.As(err, &te) || te.Tier != event.TierFentry || !isFunctionHook(te.Hook) || te.Err == nil {
		t.Fatalf("forced fentry where %s: want a TierError for a function hook, got %v", limit, err)
	}
	t.Logf("forced fentry refused as expected: %v", err)
	opts.Attach = event.TierNone
	tr = open(t, opts)
	if tr.Mode() != ModeFunction {
		t.Fatalf("where %s the automatic choice must still be the function mode (kprobe), got %s", limit, tr.Mode())
	}
	for _, p := range tr.Probes() {
		if !isFunctionHook(p.Hook) || p.Tier == event.TierFentry {
			continue
		}
		if !p.Attached || p.Tier != event.TierKprobe || p.Err == nil {
			t.Errorf("%s where %s: want kprobe attached and the reason fentry was skipped, got %s", p.Hook, limit, p)
		}
	}
	if p := probeByHook(tr, "nf_conntrack_confirm"); p.Tier != event.TierKprobe {
		t.Errorf("nf_conntrack_confirm where %s: want the kprobe fallback, got %s", limit, p)
	}
	return tr
}

// kernelHasType reports whether the running kernel's BTF has a type named name.
func kernelHasType(t *testing.T, name string) bool {
	t.Helper()
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		t.Fatalf("loading kernel BTF: %v", err)
	}
	_, err = spec.AnyTypeByName(name)
	if err != nil && !errors.Is(err, btf.ErrNotFound) {
		t.Fatalf("looking up %s in kernel BTF: %v", name, err)
	}
	return err == nil
}
