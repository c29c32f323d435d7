package testutil

import (
	"os"
	"strconv"
	"testing"
)

// RequireRoot skips t unless the test runs as root. Privileged tests call it
// first; CI runs as root, so there they always run.
func RequireRoot(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("privileged test skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: run the privileged tests with sudo (make test)")
	}
}

// InCI reports whether the test runs under CI, where a missing feature that
// this project's own scripts install is a failure, not a reason to skip.
func InCI() bool { return os.Getenv("CI") != "" }

// SkipOrFail skips t with reason on a developer machine and fails it in CI.
func SkipOrFail(t testing.TB, reason string) {
	t.Helper()
	if InCI() {
		t.Fatalf("required in CI: %s", reason)
	}
	t.Skip(reason)
}

// EnvInt is the number in environment variable name, def when it is unset.
// A value that is not a number, or is below min, fails t: a test knob
// mistyped must not quietly run the default.
func EnvInt(t testing.TB, name string, def, min int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min {
		t.Fatalf("%s=%q: want a number >= %d", name, v, min)
	}
	return n
}
