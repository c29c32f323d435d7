package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// dnsraceBin is the binary under test, built once by TestMain so the
// end-to-end tests run the real program, signals and exit codes included.
var dnsraceBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dnsrace-e2e-")
	if err != nil {
		panic(err)
	}
	// World-readable so a test can run it as an unprivileged user.
	_ = os.Chmod(dir, 0o755)
	dnsraceBin = filepath.Join(dir, "dnsrace")
	out, err := exec.Command("go", "build", "-o", dnsraceBin, ".").CombinedOutput()
	if err != nil {
		os.Stderr.Write(out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	code           int
	stdout, stderr string
}

func runBin(t *testing.T, timeout time.Duration, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, dnsraceBin, args...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running dnsrace %v: %v", args, err)
	}
	return result{code, so.String(), se.String()}
}

func TestUnknownCommand(t *testing.T) {
	r := runBin(t, 10*time.Second, "nope")
	if r.code != 2 || !strings.Contains(r.stderr, `unknown command "nope"`) {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}
