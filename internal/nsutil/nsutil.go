package nsutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// RunDir is where iproute2 keeps named namespaces; EtcDir holds their
// per-namespace /etc overrides.
const (
	RunDir = "/run/netns"
	EtcDir = "/etc/netns"
)

// Path returns the bind-mount path of the named namespace.
func Path(name string) string { return filepath.Join(RunDir, name) }

// Exists reports whether a named namespace is mounted.
func Exists(name string) bool {
	_, err := os.Stat(Path(name))
	return err == nil
}

// Create makes a new named network namespace. It fails if one with that name
// already exists.
func Create(name string) error {
	if Exists(name) {
		return fmt.Errorf("network namespace %s already exists", name)
	}
	return onThread(func() error {
		// NewNamed moves the calling thread into the new namespace; the
		// thread dies with onThread's goroutine.
		h, err := netns.NewNamed(name)
		if err != nil {
			return fmt.Errorf("creating network namespace %s: %w", name, err)
		}
		return h.Close()
	})
}

// Delete unmounts and removes a named namespace and its /etc/netns folder.
// A missing namespace is not an error.
func Delete(name string) error {
	var errs []error
	if Exists(name) {
		if err := netns.DeleteNamed(name); err != nil {
			errs = append(errs, fmt.Errorf("deleting network namespace %s: %w", name, err))
		}
	}
	if err := os.RemoveAll(filepath.Join(EtcDir, name)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// List returns the names of the named namespaces that start with prefix.
func List(prefix string) ([]string, error) {
	ents, err := os.ReadDir(RunDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// Inode returns the namespace's inode number, the id BPF programs see
// (net->ns.inum).
func Inode(name string) (uint32, error) {
	ino, ok := PathInode(Path(name))
	if !ok {
		return 0, fmt.Errorf("reading network namespace %s: not found", name)
	}
	return ino, nil
}

// PathInode returns the inode of a namespace file (/run/netns/NAME,
// /proc/PID/ns/net): the netns id BPF programs report (net->ns.inum).
func PathInode(path string) (uint32, bool) {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0, false
	}
	return uint32(st.Ino), true
}

// Do runs fn with the calling goroutine's thread inside the named namespace.
func Do(name string, fn func() error) error {
	return onThread(func() error {
		h, err := netns.GetFromPath(Path(name))
		if err != nil {
			return fmt.Errorf("opening network namespace %s: %w", name, err)
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			return fmt.Errorf("entering network namespace %s: %w", name, err)
		}
		return fn()
	})
}

// DoPath runs fn with the calling goroutine's thread inside the network
// namespace at path (/run/netns/NAME, /proc/PID/ns/net, any nsfs file); ""
// runs fn in place, in the caller's own namespace. Programs that fn starts
// inherit the namespace.
func DoPath(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	return onThread(func() error {
		h, err := netns.GetFromPath(path)
		if err != nil {
			return fmt.Errorf("opening network namespace %s: %w", path, err)
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			return fmt.Errorf("entering network namespace %s: %w", path, err)
		}
		return fn()
	})
}

// DoHandle runs fn with the calling goroutine's thread inside the namespace
// of h.
func DoHandle(h netns.NsHandle, fn func() error) error {
	return onThread(func() error {
		if err := netns.Set(h); err != nil {
			return fmt.Errorf("entering a network namespace: %w", err)
		}
		return fn()
	})
}

// NewAnonymous creates a network namespace with no name: it lives as long as
// the returned handle (and anything made in it, such as a socket) is open.
func NewAnonymous() (netns.NsHandle, error) {
	var h netns.NsHandle
	err := onThread(func() error {
		var err error
		if h, err = netns.New(); err != nil {
			return fmt.Errorf("creating a network namespace: %w", err)
		}
		return nil
	})
	return h, err
}

// onThread runs fn on a locked OS thread and puts the thread back in its
// original network namespace after. Only if that succeeds is the thread
// unlocked; otherwise it stays locked and the runtime ends it with the
// goroutine. Restoring matters: the goroutine may run on the main thread,
// which Go never ends, and whose namespace is the process's
// (/proc/self/ns/net).
func onThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("reading the thread's network namespace: %w", err)
			return
		}
		defer orig.Close()
		err = fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// ExecHelperArg is the hidden first argument under which the binary acts as
// the namespace-entering helper of Command.
const ExecHelperArg = "__nsexec"

// Command returns a command that runs argv inside the named namespace with
// /etc/netns/NAME/* bind-mounted over /etc, like `ip netns exec NAME argv...`.
// The child is killed when the parent dies (Pdeathsig) and gets its own
// process group, so a teardown can kill everything it started.
func Command(ctx context.Context, name string, argv ...string) *exec.Cmd {
	self, err := os.Executable()
	if err != nil {
		self = "/proc/self/exe"
	}
	args := append([]string{ExecHelperArg, name, "--"}, argv...)
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return cmd
}

// MaybeExecHelper runs the helper side of Command and never returns when
// os.Args asks for it. Every binary that uses Command calls it first in main
// (tests: in TestMain).
func MaybeExecHelper() {
	if len(os.Args) < 4 || os.Args[1] != ExecHelperArg || os.Args[3] != "--" {
		return
	}
	err := execInNamespace(os.Args[2], os.Args[4:])
	fmt.Fprintf(os.Stderr, "dnsrace %s: %v\n", ExecHelperArg, err)
	os.Exit(127)
}

func execInNamespace(name string, argv []string) error {
	if len(argv) == 0 {
		return errors.New("no command")
	}
	runtime.LockOSThread()
	// A private mount namespace for this process only, so the bind mounts
	// below vanish with it.
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unsharing mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	h, err := netns.GetFromPath(Path(name))
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", name, err)
	}
	if err := netns.Set(h); err != nil {
		return fmt.Errorf("entering network namespace %s: %w", name, err)
	}
	ents, _ := os.ReadDir(filepath.Join(EtcDir, name))
	for _, e := range ents {
		src := filepath.Join(EtcDir, name, e.Name())
		dst := filepath.Join("/etc", e.Name())
		if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mounting %s over %s: %w", src, dst, err)
		}
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	return unix.Exec(path, argv, os.Environ())
}

// Start starts cmd (from Command) and returns a channel that yields its
// Wait result. The child's Pdeathsig fires when the *thread* that forked it
// exits, and Go ends threads (those of Do, for one); so the fork happens on
// a thread locked for as long as the child lives.
func Start(cmd *exec.Cmd) (<-chan error, error) {
	started := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread() // the thread never changed namespace
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		done <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return done, nil
}
