package probe

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/dnsrace/dnsrace/internal/bpf"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// BenchmarkFlowBirth measures what a new query's flow costs in the flows
// map, as the tracer sizes it, full and evicting: the insert alone (the
// tracepoint tier, where a later hop's lookup marks the entry) and the
// insert with the lookup right after it that the send hooks of the fentry
// and kprobe tiers add (new_flow: a full LRU evicts entries no lookup
// marked first). The difference is the birth lookup's price per query.
// The map operations are the tiers' own; only the hook's dispatch differs,
// and that is outside both figures. ns/op is the kernel's own time per
// run (BPF_PROG_TEST_RUN), which includes a random key's draw.
//
//	sudo go test -run '^$' -bench FlowBirth -benchtime 2000000x ./internal/probe/
func BenchmarkFlowBirth(b *testing.B) {
	testutil.RequireRoot(b)
	for _, v := range []struct {
		name   string
		lookup bool
	}{{"insert", false}, {"insert+lookup", true}} {
		b.Run(v.name, func(b *testing.B) {
			flows := newFlowsMap(b)
			prog := flowBirthProgram(b, flows, v.lookup)
			// Fill the map twice over first: the measured inserts
			// evict, as on a node where unanswered queries fill it.
			if _, _, err := prog.Benchmark(make([]byte, 14), int(2*flows.MaxEntries()), nil); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			_, per, err := prog.Benchmark(make([]byte, 14), b.N, b.ResetTimer)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(per.Nanoseconds()), "ns/op")
		})
	}
}

// newFlowsMap creates the object's flows map with the loader's sizing.
func newFlowsMap(b *testing.B) *ebpf.Map {
	spec, err := bpf.LoadDnsrace()
	if err != nil {
		b.Fatal(err)
	}
	if err := addLRURoom(spec); err != nil {
		b.Fatal(err)
	}
	m, err := ebpf.NewMap(spec.Maps[bpf.DnsraceMapFlows])
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m
}

// flowBirthProgram inserts a flow under a random key (four random bytes of
// its source address, the rest zero) and, with lookup, looks it up again.
func flowBirthProgram(b *testing.B, flows *ebpf.Map, lookup bool) *ebpf.Program {
	// The value is all zeroes, so its size can follow struct flow; the key's
	// first four bytes must still be its source address.
	const keyOff = -40 // struct flow_key (40 B)
	if flows.KeySize() != -keyOff || flows.ValueSize()%8 != 0 {
		b.Fatalf("flows map: key %d B, value %d B: the program below is out of date", flows.KeySize(), flows.ValueSize())
	}
	valOff := int16(keyOff - int(flows.ValueSize()))
	insns := asm.Instructions{asm.Mov.Imm(asm.R0, 0)}
	for off := valOff; off < 0; off += 8 {
		insns = append(insns, asm.StoreMem(asm.RFP, off, asm.R0, asm.DWord))
	}
	insns = append(insns,
		asm.FnGetPrandomU32.Call(),
		asm.StoreMem(asm.RFP, keyOff, asm.R0, asm.Word),
		asm.LoadMapPtr(asm.R1, flows.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyOff),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, int32(valOff)),
		asm.Mov.Imm(asm.R4, 0), // BPF_ANY
		asm.FnMapUpdateElem.Call(),
	)
	if lookup {
		insns = append(insns,
			asm.LoadMapPtr(asm.R1, flows.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, keyOff),
			asm.FnMapLookupElem.Call(),
		)
	}
	insns = append(insns, asm.Mov.Imm(asm.R0, 0), asm.Return())
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "GPL", Instructions: insns})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { prog.Close() })
	return prog
}
