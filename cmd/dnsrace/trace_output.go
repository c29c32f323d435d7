package main

import (
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
)

// This file is dnsrace trace's output: the writer that reports the first
// failed write, --output-file with its rotation, and the size flag that
// bounds it.

// byteSize is a size flag: a number of bytes with an optional K, M or G
// (powers of 1024) suffix.
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }
func (b *byteSize) Type() string   { return "SIZE" }
func (b *byteSize) Set(s string) error {
	mult := int64(1)
	t := strings.TrimSuffix(strings.ToUpper(s), "B")
	switch {
	case strings.HasSuffix(t, "K"):
		mult, t = 1<<10, strings.TrimSuffix(t, "K")
	case strings.HasSuffix(t, "M"):
		mult, t = 1<<20, strings.TrimSuffix(t, "M")
	case strings.HasSuffix(t, "G"):
		mult, t = 1<<30, strings.TrimSuffix(t, "G")
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return fmt.Errorf("want a size like 4096, 512K, 100M or 1G, got %q", s)
	}
	if n > math.MaxInt64/mult {
		return fmt.Errorf("size %q is too large", s)
	}
	*b = byteSize(n * mult)
	return nil
}

// outputWriter is where incidents and the summary go. It remembers the
// first write error and reports it on one line to report; after it,
// nothing more is written to w (a line cut off by a full disk stays the
// last one) and Write fails at once.
type outputWriter struct {
	mu     sync.Mutex
	w      io.Writer
	name   string // "stdout" or the --output-file path
	report io.Writer
	err    error
}

func (o *outputWriter) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err != nil {
		return 0, o.err
	}
	n, err := o.w.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	if err != nil {
		o.err = err
		if pe, ok := err.(*fs.PathError); ok {
			err = pe.Err // "write PATH: ...": the path is the name already
		}
		fmt.Fprintf(o.report, "dnsrace trace: writing %s: %v (nothing more is written there; the summary goes to stderr)\n", o.name, err)
	}
	return n, o.err
}

// Err returns the first write error, or nil.
func (o *outputWriter) Err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}

// rotatingFile is --output-file: when a write would take it past max
// bytes, it is renamed to PATH.1 (replacing the previous PATH.1) and a new
// PATH is started, so at most about 2*max bytes stay on disk. A write is
// one incident line (or the summary), so no line is split.
type rotatingFile struct {
	mu   sync.Mutex
	path string
	max  int64
	f    *os.File
	size int64
}

func openRotating(path string, max int64) (*rotatingFile, error) {
	r := &rotatingFile{path: path, max: max}
	if err := r.open(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *rotatingFile) open() error {
	f, err := os.OpenFile(r.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening the output file: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("opening the output file: %w", err)
	}
	r.f, r.size = f, st.Size()
	return nil
}

func (r *rotatingFile) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.max > 0 && r.size > 0 && r.size+int64(len(p)) > r.max {
		r.f.Close()
		if err := os.Rename(r.path, r.path+".1"); err != nil {
			return 0, fmt.Errorf("rotating the output file: %w", err)
		}
		if err := r.open(); err != nil {
			return 0, err
		}
	}
	n, err := r.f.Write(p)
	r.size += int64(n)
	return n, err
}

func (r *rotatingFile) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.f.Close()
}
