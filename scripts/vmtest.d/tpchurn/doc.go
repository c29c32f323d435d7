// Package tpchurn holds the vmtest guests' checks of the emulator itself,
// the reproducer of the "Oops: int3 at kmem_cache_free" that killed 6.12
// vmtest guests and the property whose absence caused it:
//
//   - TestRawTracepointChurn attaches and detaches one trivial raw
//     tracepoint program on kmem_cache_free in a tight loop while other
//     goroutines create and tear down network namespaces joined by veth
//     pairs with conntrack traffic, so that kmem_cache_free runs on every
//     CPU while its tracepoint site is live-patched (static key and static
//     call, through text_poke_bp's int3 protocol). A guest whose emulator
//     executes stale code dies of an int3 oops here.
//   - TestCrossModifyingCode (amd64) rewrites an instruction in user space
//     and makes every CPU serialise (membarrier SYNC_CORE, the protocol JITs
//     use); no CPU may then run the old instruction. x86 hardware guarantees
//     it; qemu's multi-threaded TCG does not.
//
// Both run on the host (make test-host, short) and in every vmtest guest
// (suite "tpchurn"), where they check the qemu configuration. See
// docs/vmtest.md, "The int3 oops".
package tpchurn
