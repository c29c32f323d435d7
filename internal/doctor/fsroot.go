package doctor

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// maxRead caps what doctor reads from one file; the inputs are small text
// files, and a node's /proc/kallsyms is read by streaming instead.
const maxRead = 4 << 20

// hostPath returns p (an absolute path on the node) under the root.
func (e *env) hostPath(p string) string { return filepath.Join(e.Root, p) }

// resolveIn resolves p inside root the way the node would: symbolic links
// are followed, and absolute targets are taken relative to root, not to the
// machine doctor runs on. It returns the resulting path on this machine and
// the chain of links it followed ("/etc/resolv.conf -> ../run/...").
// A missing final component is not an error here; reading it will be.
func resolveIn(root, p string) (string, []string, error) {
	var chain []string
	pending := splitPath(p)
	cur, curDir := "/", true
	for hops := 0; len(pending) > 0; {
		c := pending[0]
		pending = pending[1:]
		if c == "" || c == "." || c == ".." {
			// "file/", "file/." and "file/.." fail on the node too.
			if !curDir {
				return "", chain, &fs.PathError{Op: "resolve", Path: p, Err: syscall.ENOTDIR}
			}
			if c == ".." {
				cur = path.Dir(cur)
			}
			continue
		}
		next := path.Join(cur, c)
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			// Leave the rest unresolved; the caller's read reports it.
			// Unless the rest climbs back out with "..": the node stops
			// at the missing component, a lexical ".." would not.
			for _, r := range pending {
				if r == ".." {
					return "", chain, &fs.PathError{Op: "resolve", Path: p, Err: unwrapPathErr(err)}
				}
			}
			rest := path.Join(append([]string{next}, pending...)...)
			return filepath.Join(root, rest), chain, nil
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur, curDir = next, fi.IsDir()
			continue
		}
		hops++
		if hops > 40 {
			return "", chain, fmt.Errorf("resolving %s: too many levels of symbolic links", p)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", chain, fmt.Errorf("resolving %s: %w", p, err)
		}
		chain = append(chain, next+" -> "+target)
		if path.IsAbs(target) {
			cur = "/"
		}
		pending = append(splitPath(target), pending...)
	}
	return filepath.Join(root, cur), chain, nil
}

func splitPath(p string) []string { return strings.Split(p, "/") }

// readIn reads the node path p under root, following links within root.
// It refuses directories and anything larger than maxRead.
func readIn(root, p string) ([]byte, []string, error) {
	real, chain, err := resolveIn(root, p)
	if err != nil {
		return nil, chain, err
	}
	b, err := readCapped(real)
	if err != nil {
		return nil, chain, fmt.Errorf("reading %s: %w", p, unwrapPathErr(err))
	}
	return b, chain, nil
}

func readCapped(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		return nil, errors.New("is a directory, want a file")
	}
	b, err := io.ReadAll(io.LimitReader(f, maxRead+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxRead {
		return nil, fmt.Errorf("larger than %d bytes", maxRead)
	}
	return b, nil
}

// unwrapPathErr drops the *PathError's own path (the machine-local one) so
// messages show the node path instead.
func unwrapPathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// read reads a node path (see readIn).
func (e *env) read(p string) ([]byte, []string, error) { return readIn(e.Root, p) }

// exists reports whether the node path p exists (following links in root).
func (e *env) exists(p string) bool {
	real, _, err := resolveIn(e.Root, p)
	if err != nil {
		return false
	}
	_, err = os.Stat(real)
	return err == nil
}

// sysfsLink reads a sysfs attribute that is a symbolic link on a real node
// (/sys/class/net/eth0/master) and returns the base name of its target.
// Fixture trees may store it as a plain file holding the name instead.
// The kernel resolves sysfs's own relative links, so no re-rooting here.
func (e *env) sysfsLink(p string) (string, error) {
	full := e.hostPath(p)
	fi, err := os.Lstat(full)
	if err != nil {
		return "", unwrapPathErr(err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		t, err := os.Readlink(full)
		if err != nil {
			return "", unwrapPathErr(err)
		}
		return path.Base(t), nil
	}
	if fi.IsDir() {
		return "", errors.New("is a directory, want a link or a file")
	}
	b, err := readCapped(full)
	if err != nil {
		return "", unwrapPathErr(err)
	}
	name := strings.TrimSpace(string(b))
	if name == "" || strings.ContainsAny(name, "/ \t\n") {
		return "", fmt.Errorf("holds %q, want an interface name", name)
	}
	return path.Base(name), nil
}

// sysfsString reads a one-line sysfs attribute.
func (e *env) sysfsString(p string) (string, error) {
	b, err := readCapped(e.hostPath(p))
	if err != nil {
		return "", unwrapPathErr(err)
	}
	return strings.TrimSpace(string(b)), nil
}

// isDir reports whether the node path (not following links in root) is a
// directory.
func (e *env) isDir(p string) bool {
	fi, err := os.Stat(e.hostPath(p))
	return err == nil && fi.IsDir()
}
