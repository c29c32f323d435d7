package overhead

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// TestHungStacksNamesTheBlockedGoroutine has a real Go process (this test
// binary, re-run) block in a function of its own, makes it print its
// stacks with SIGQUIT, and reads where it hangs from them.
func TestHungStacksNamesTheBlockedGoroutine(t *testing.T) {
	if os.Getenv("DNSRACE_TEST_HANG") == "1" {
		blockForever()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHungStacksNamesTheBlockedGoroutine$")
	cmd.Env = append(os.Environ(), "DNSRACE_TEST_HANG=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "blocked\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("helper: %q, %v", line, err)
	}
	_ = cmd.Process.Signal(syscall.SIGQUIT)
	_ = cmd.Wait()

	got := hungStacks(stderr.Bytes(), 4000)
	_, summary, ok := strings.Cut(got, "where dnsrace's goroutines were:\n")
	if !ok {
		t.Fatalf("no summary in:\n%s", got)
	}
	var hung string
	for _, l := range strings.Split(summary, "\n") {
		if strings.Contains(l, "overhead.blockForever at ") {
			hung = l
		}
	}
	// Its state is "chan receive", or "syscall" if the signal came while
	// its line was still being written.
	if hung == "" || !strings.HasPrefix(hung, "goroutine ") || !strings.Contains(hung, "[") || !strings.Contains(hung, "stacks_test.go:") {
		t.Errorf("the blocked goroutine is not named with its state and line; summary:\n%s", summary)
	}
	if strings.Contains(got, "runtime.bgsweep") {
		t.Errorf("the runtime's own goroutines were kept:\n%s", got)
	}
	if short := hungStacks(stderr.Bytes(), 100); !strings.HasSuffix(short, summary) {
		t.Errorf("a cut dump lost its summary:\n%s", short)
	}
}

// blockForever says it is blocked and waits on a channel nobody sends on.
func blockForever() {
	never := make(chan struct{})
	os.Stdout.WriteString("blocked\n")
	<-never
}
