//go:build ignore

// Writes the minimal vmlinux BTF of the healthy fixture: the conntrack
// enums of a 5.15 kernel (IPS_NAT_CLASH_BIT, CTA_STATS_CLASH_RESOLVE,
// CTA_STATS_CHAIN_TOOLONG) and nf_ct_resolve_clash's 5.6+ prototype.
package main

import (
	"os"

	"github.com/cilium/ebpf/btf"
)

func main() {
	u32 := &btf.Int{Name: "unsigned int", Size: 4}
	ptr := &btf.Pointer{Target: &btf.Void{}}
	types := []btf.Type{
		&btf.Enum{Name: "ip_conntrack_status", Size: 4, Values: []btf.EnumValue{
			{Name: "IPS_EXPECTED_BIT", Value: 0}, {Name: "IPS_CONFIRMED_BIT", Value: 3},
			{Name: "IPS_UNTRACKED_BIT", Value: 12}, {Name: "IPS_NAT_CLASH_BIT", Value: 12}, {Name: "IPS_NAT_CLASH", Value: 4096}}},
		&btf.Enum{Name: "ctattr_stats_cpu", Size: 4, Values: []btf.EnumValue{
			{Name: "CTA_STATS_UNSPEC", Value: 0}, {Name: "CTA_STATS_CLASH_RESOLVE", Value: 14}, {Name: "CTA_STATS_CHAIN_TOOLONG", Value: 15}}},
		&btf.Func{Name: "nf_ct_resolve_clash", Linkage: btf.StaticFunc, Type: &btf.FuncProto{Return: &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed},
			Params: []btf.FuncParam{{Name: "skb", Type: ptr}, {Name: "h", Type: ptr}, {Name: "reply_hash", Type: u32}}}},
	}
	b, err := btf.NewBuilder(types, nil)
	if err != nil {
		panic(err)
	}
	raw, err := b.Marshal(nil, nil)
	if err != nil {
		panic(err)
	}
	if err := os.WriteFile(os.Args[1], raw, 0o444); err != nil {
		panic(err)
	}
}
