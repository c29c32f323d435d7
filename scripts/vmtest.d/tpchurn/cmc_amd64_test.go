package tpchurn

import (
	"encoding/binary"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/testutil"
)

// membarrier(2) commands (linux/membarrier.h).
const (
	membarrierPrivateExpeditedSyncCore         = 1 << 5
	membarrierRegisterPrivateExpeditedSyncCore = 1 << 6
)

func membarrier(cmd uintptr) error {
	if _, _, e := unix.Syscall(unix.SYS_MEMBARRIER, cmd, 0, 0); e != 0 {
		return e
	}
	return nil
}

// TestCrossModifyingCode checks the x86 cross-modifying-code rule that
// the kernel's text_poke_bp relies on, in user space: one thread rewrites
// the immediate of "mov eax, imm32; ret" with a new generation number and
// then makes every CPU of the process serialise (membarrier SYNC_CORE);
// only then does it publish the generation. Another thread, pinned to its own
// OS thread, reads the published generation and runs the instruction: it must
// never get an older one. On the host's CPUs: none in about 10^9 runs; under
// qemu 7.2's multi-threaded TCG two thirds of the runs got an older one
// (docs/vmtest.md).
func TestCrossModifyingCode(t *testing.T) {
	if testing.Short() {
		t.Skip("a 5-second loop: skipped in -short mode")
	}
	seconds := testutil.EnvInt(t, "DNSRACE_CMC_SECONDS", 5, 0)
	if runtime.NumCPU() < 2 {
		t.Skip("needs two CPUs: with one there is no other CPU to run stale code")
	}
	if err := membarrier(membarrierRegisterPrivateExpeditedSyncCore); err != nil {
		t.Skipf("membarrier SYNC_CORE unavailable: %v", err)
	}
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE|unix.PROT_EXEC, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		t.Fatalf("mapping an executable page: %v", err)
	}
	defer unix.Munmap(mem)
	// mov eax, imm32 ; ret. The immediate (bytes 1-4) lies within one
	// 8-byte word, so its store is atomic.
	code := mem[0x100:0x106]
	code[0] = 0xb8
	binary.LittleEndian.PutUint32(code[1:5], 0)
	code[5] = 0xc3
	addr := uintptr(unsafe.Pointer(&code[0]))
	imm := (*uint32)(unsafe.Pointer(&code[1]))

	var published atomic.Uint32
	var stop atomic.Bool
	var runs, stale, maxLag uint64
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for !stop.Load() {
			p := published.Load()
			v := uint32(callCode(addr))
			runs++
			if v < p {
				stale++
				maxLag = max(maxLag, uint64(p-v))
			}
		}
	}()
	deadline := time.Now().Add(time.Duration(seconds) * time.Second)
	var gen uint32
	for time.Now().Before(deadline) {
		gen++
		atomic.StoreUint32(imm, gen)
		if err := membarrier(membarrierPrivateExpeditedSyncCore); err != nil {
			stop.Store(true)
			<-done
			t.Fatalf("membarrier SYNC_CORE: %v", err)
		}
		published.Store(gen)
	}
	stop.Store(true)
	<-done
	t.Logf("CMC generations=%d runs=%d stale_after_sync=%d max_lag=%d", gen, runs, stale, maxLag)
	if runs == 0 || gen == 0 {
		t.Fatalf("%d generations written, %d runs: the check tested nothing", gen, runs)
	}
	if stale > 0 {
		t.Errorf("%d of %d runs executed an instruction older than a completed write and SYNC_CORE (up to %d generations old): this CPU or emulator does not honour cross-modifying code", stale, runs, maxLag)
	}
}
