package probe

import (
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// lruRoomPerCPU is how many entries of a common (not per-CPU) LRU hash map
// one CPU can keep out of its window of live entries. A CPU takes free
// entries from the shared lists 128 at a time (LOCAL_FREE_TARGET in
// kernel/bpf/bpf_lru_list.c; 6.16 lowers it for small maps), evicting as
// many to get them, and holds the ones it has not used yet aside: an entry
// can be evicted after about size - 128 x CPUs - 128 newer inserts, not
// size; two batches per CPU on top keep the window the size. (The flow
// table is no LRU for this and its cost: sweep.go.)
const lruRoomPerCPU = 2 * 128

// addLRURoom gives every common LRU hash map of spec lruRoomPerCPU entries
// per possible CPU on top of its size, so that its size is what it holds
// (a flow's window is what decides whether its answer finds it), and at
// most its size again: the cost is kernel memory charged to the tracer's
// cgroup, 90-180 bytes an entry (bpftool's memlock), so a map at most
// doubles however many CPUs a node has. Past 128 CPUs the window of a
// 32,768-entry map is then 65,536 - 128 x (CPUs + 1): 40,832 at 192, what
// it was sized for at 255 (only CPUs that insert take entries aside, and
// 6.16 takes fewer on many CPUs).
func addLRURoom(spec *ebpf.CollectionSpec) error {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("counting the possible CPUs: %w", err)
	}
	for _, m := range spec.Maps {
		if m.Type == ebpf.LRUHash && m.Flags&unix.BPF_F_NO_COMMON_LRU == 0 {
			m.MaxEntries += min(uint32(cpus*lruRoomPerCPU), m.MaxEntries)
		}
	}
	return nil
}
