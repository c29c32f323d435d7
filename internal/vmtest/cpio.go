package vmtest

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// cpioWriter writes a "newc" cpio archive, the format the kernel unpacks as
// an initramfs. Parent folders are added before their first entry (the
// kernel creates no missing folders); archives may be concatenated.
type cpioWriter struct {
	w    io.Writer
	ino  int
	dirs map[string]bool
	err  error
}

func newCpio(w io.Writer) *cpioWriter {
	return &cpioWriter{w: w, ino: 1, dirs: map[string]bool{".": true, "/": true}}
}

func (c *cpioWriter) header(name string, mode uint32, size int) {
	if c.err != nil {
		return
	}
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, len(name)+1, 0)
	_, c.err = io.WriteString(c.w, hdr+name+"\x00"+pad(len(hdr)+len(name)+1))
}

func pad(n int) string { return strings.Repeat("\x00", (4-n%4)%4) }

// Dir adds a folder (and its parents).
func (c *cpioWriter) Dir(name string) {
	name = strings.TrimPrefix(path.Clean(name), "/")
	if c.dirs[name] || name == "" {
		return
	}
	c.Dir(path.Dir(name))
	c.dirs[name] = true
	c.header(name, 0o040755, 0)
}

// File adds a file with the given contents.
func (c *cpioWriter) File(name string, mode fs.FileMode, data []byte) {
	name = strings.TrimPrefix(path.Clean(name), "/")
	c.Dir(path.Dir(name))
	c.header(name, 0o100000|uint32(mode.Perm()), len(data))
	if c.err == nil {
		_, c.err = c.w.Write(data)
	}
	if c.err == nil {
		_, c.err = io.WriteString(c.w, pad(len(data)))
	}
}

// Copy adds the host file src as name (symbolic links followed).
func (c *cpioWriter) Copy(name, src string) {
	if c.err != nil {
		return
	}
	data, err := os.ReadFile(src)
	if err != nil {
		c.err = fmt.Errorf("reading %s: %w", src, err)
		return
	}
	st, err := os.Stat(src)
	if err != nil {
		c.err = err
		return
	}
	c.File(name, st.Mode(), data)
}

// Tree adds the host folder src, its files and folders, under name.
func (c *cpioWriter) Tree(name, src string) {
	if c.err != nil {
		return
	}
	c.err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		dst := path.Join(name, filepath.ToSlash(rel))
		if d.IsDir() {
			c.Dir(dst)
		} else {
			c.Copy(dst, p)
		}
		return c.err
	})
}

// Symlink adds a symbolic link.
func (c *cpioWriter) Symlink(name, target string) {
	name = strings.TrimPrefix(path.Clean(name), "/")
	c.Dir(path.Dir(name))
	c.header(name, 0o120777, len(target))
	if c.err == nil {
		_, c.err = io.WriteString(c.w, target+pad(len(target)))
	}
}

// Close writes the trailer and reports the first error.
func (c *cpioWriter) Close() error {
	c.header("TRAILER!!!", 0, 0)
	return c.err
}

// writeCpio writes the archive fill makes to file.
func writeCpio(file string, fill func(c *cpioWriter)) error {
	f, err := os.Create(file + ".tmp")
	if err != nil {
		return err
	}
	c := newCpio(f)
	fill(c)
	err = c.Close()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(file+".tmp", file)
	}
	if err != nil {
		os.Remove(file + ".tmp")
		return fmt.Errorf("writing %s: %w", file, err)
	}
	return nil
}
