package probe

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// NiceThread locks the calling goroutine to its thread and gives that
// thread nice value n. restore gives the thread its nice value back and
// unlocks it; call it before the goroutine ends. A goroutine that ends
// locked ends its thread, except the process's main thread, which the Go
// runtime keeps, parked, with its nice value: restoring is what guarantees
// no other thread keeps n.
func NiceThread(n int) (restore func(), err error) {
	runtime.LockOSThread()
	tid := unix.Gettid()
	// The raw getpriority(2) system call returns 20 - nice.
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	if err != nil {
		return nil, err // stays locked: the thread ends with its goroutine
	}
	if err := unix.Setpriority(unix.PRIO_PROCESS, tid, n); err != nil {
		return nil, err
	}
	return func() {
		// Raising a nice value back needs no privilege; should it fail,
		// the thread stays locked and ends with its goroutine.
		if unix.Setpriority(unix.PRIO_PROCESS, tid, 20-prio) == nil {
			runtime.UnlockOSThread()
		}
	}, nil
}
