package overhead

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// syscallLoop runs one loop of system calls that send no packet, on every
// CPU, for d, and returns how many iterations completed. Programs attached
// to generic kernel paths (a slab free, a scheduler event) show up here,
// where the tracer has nothing to trace:
//
//	fork  fork and exec /bin/true, wait for it
//	open  open and close /dev/null
//	mmap  map 64 KiB anonymous memory, touch a page, unmap it
func syscallLoop(ctx context.Context, kind string, d time.Duration) (uint64, error) {
	var step func() error
	switch kind {
	case "fork":
		truePath := "/bin/true"
		if _, err := os.Stat(truePath); err != nil {
			truePath = "/usr/bin/true"
		}
		attr := &syscall.ProcAttr{Env: []string{}}
		step = func() error {
			pid, err := syscall.ForkExec(truePath, []string{"true"}, attr)
			if err != nil {
				return err
			}
			var ws syscall.WaitStatus
			_, err = syscall.Wait4(pid, &ws, 0, nil)
			return err
		}
	case "open":
		step = func() error {
			fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			return unix.Close(fd)
		}
	case "mmap":
		step = func() error {
			b, err := unix.Mmap(-1, 0, 64<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
			if err != nil {
				return err
			}
			b[0] = 1
			return unix.Munmap(b)
		}
	default:
		return 0, fmt.Errorf("unknown system call loop %q", kind)
	}
	var (
		n    atomic.Uint64
		wg   sync.WaitGroup
		once sync.Once
		ferr error
	)
	deadline := time.Now().Add(d)
	for range runtime.NumCPU() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				if i%64 == 0 && time.Now().After(deadline) {
					return
				}
				if err := step(); err != nil {
					once.Do(func() { ferr = fmt.Errorf("%s loop: %w", kind, err) })
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	return n.Load(), ferr
}
