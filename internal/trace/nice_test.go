package trace

import (
	"io"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/probe"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// threadsWithNice counts this process's threads whose nice value is n.
func threadsWithNice(t *testing.T, n int) int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			continue
		}
		// The raw getpriority(2) system call returns 20 - nice.
		prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
		if err != nil {
			continue // the thread ended
		}
		if 20-prio == n {
			count++
		}
	}
	return count
}

// TestReaderNice: Options.ReaderNice gives the reader's thread and the
// thread that drains the ring buffer for it, and only them, that nice
// value, for as long as the session reads; the threads end with it.
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
	// The drain thread takes its nice value once the reader starts it.
	if n := waitThreadsWithNice(t, nice, 2); n != 2 {
		t.Errorf("%d threads at nice %d while reading, want the reader's and the drain's", n, nice)
	}
	s.Stop()
	if n := waitThreadsWithNice(t, nice, 0); n != 0 {
		t.Errorf("%d threads at nice %d after Stop, want none", n, nice)
	}
}

// waitThreadsWithNice polls, for up to two seconds, until want threads
// have nice value n, and returns the last count.
func waitThreadsWithNice(t *testing.T, n, want int) int {
	t.Helper()
	got := threadsWithNice(t, n)
	for deadline := time.Now().Add(2 * time.Second); got != want && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		got = threadsWithNice(t, n)
	}
	return got
}
