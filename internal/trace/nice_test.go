package trace

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/probe"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// threadsWithNice counts this process's threads whose nice value is n
// (field 19 of /proc/self/task/TID/stat).
func threadsWithNice(t *testing.T, n int) int {
	t.Helper()
	stats, err := filepath.Glob("/proc/self/task/*/stat")
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended
		}
		// The command name (field 2) may hold spaces: count from its ')'.
		fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if nice, err := strconv.Atoi(fields[16]); err == nil && nice == n {
			count++
		}
	}
	return count
}

// TestReaderNice: Options.ReaderNice gives the reader's thread, and only
// it, that nice value, for as long as the session reads.
func TestReaderNice(t *testing.T) {
	testutil.RequireRoot(t)
	const nice = -7
	if n := threadsWithNice(t, nice); n != 0 {
		t.Fatalf("%d threads at nice %d before the session", n, nice)
	}
	s, err := Start(Options{Probe: probe.Options{Attach: event.TierTracepoint}, Out: io.Discard, ReaderNice: nice})
	if err != nil {
		t.Fatal(err)
	}
	if n := threadsWithNice(t, nice); n != 1 {
		t.Errorf("%d threads at nice %d while reading, want the reader's alone", n, nice)
	}
	s.Stop()
}
