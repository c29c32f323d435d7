// Command dnsrace explains why DNS lookups on a Kubernetes node stall for
// exactly one resolver timeout: it traces conntrack insertion races and the
// other ways a query or its answer is lost, reproduces them in a lab, and
// checks a node for the configurations that expose it.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// command is one `dnsrace <name>` subcommand. run gets the arguments after
// the subcommand name and returns an error; errors wrapped in usageError exit
// with status 2, the convention for bad input.
type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
}

// commands is filled by the init functions of the files that implement each
// subcommand, so each lives beside its own flags.
var commands = map[string]command{}

// usageError marks bad input: unknown flags, out-of-range values, missing
// privileges. main prints it on one line and exits 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// exitCodeError lets a command choose its exit status (doctor: 1 when it
// found a problem) without printing anything more.
type exitCodeError struct{ code int }

func (e exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func main() {
	// The binary doubles as the helper that enters a namespace for lab
	// clients (`ip netns exec` semantics); that path never returns.
	nsutil.MaybeExecHelper()
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage()
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "dnsrace: unknown command %q (see dnsrace --help)\n", args[0])
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := cmd.run(ctx, args[1:])
	var ec exitCodeError
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ec):
		return ec.code
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "dnsrace %s: %v\n", args[0], err)
		return 2
	default:
		fmt.Fprintf(os.Stderr, "dnsrace %s: %v\n", args[0], err)
		return 1
	}
}

func printUsage() {
	fmt.Fprintln(os.Stderr, "Usage: dnsrace <command> [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		if commands[n].summary != "" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(os.Stderr, "\nRun 'dnsrace <command> --help' for a command's flags and examples.")
}
