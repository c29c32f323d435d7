package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/dnsrace/dnsrace/internal/lab"
	"github.com/dnsrace/dnsrace/internal/trace"
)

func init() {
	commands["demo"] = command{summary: "run the tracer through the lab's race scenarios (no real traffic needed)", run: runDemo}
}

const demoUsage = `Usage: dnsrace demo [flags]

Build the namespace lab, trace it while the snat-port scenario (real glibc
lookups losing the SNAT port race: 5 s stalls) and the same-tuple scenario
(A and AAAA racing on one socket, rescued by the kernel) run, print every
incident and the reconciliation with the kernel's counters, tear it all
down. Needs root. About 40 seconds.

Flags:
`

func runDemo(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("demo", pflag.ContinueOnError)
	scenarios := fs.StringSlice("scenarios", []string{"snat-port", "same-tuple"}, "lab scenarios to trace")
	asJSON := fs.Bool("json", false, "JSON Lines output")
	if err := parseFlags(fs, args, demoUsage); err != nil {
		return err
	}
	scs, err := lab.LookupScenarios(*scenarios)
	if err != nil {
		return usageError{err}
	}
	if err := requireRoot("dnsrace demo"); err != nil {
		return err
	}
	for _, sc := range scs {
		if !*asJSON {
			fmt.Printf("== %s: %s\n   expected: %s\n", sc.Name, sc.Summary, sc.Expect)
		}
		var s *trace.Session
		var node uint32
		rep, err := lab.Run(ctx, lab.RunConfig{
			Prefix: "dnsrace-demo",
			Drive:  lab.DriveConfig{Scenario: sc},
			OnUp: func(l *lab.Lab) (err error) {
				s, err = trace.Start(trace.Options{Out: os.Stdout, JSON: *asJSON})
				return err
			},
		})
		var sum *trace.Summary
		if s != nil {
			sum = s.Stop()
		}
		if err != nil {
			return err
		}
		node = rep.NodeNetNS
		trace.WriteSummary(os.Stdout, sum, *asJSON)
		if !*asJSON {
			fmt.Printf("  ground truth from the lab: %d lookups, %d stalled (%d timeouts); node netns %d\n\n",
				rep.Lookups, rep.Stalls, rep.StallTimeout, node)
		}
	}
	return nil
}
