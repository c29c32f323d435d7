// Package testutil holds helpers shared by dnsrace's tests: skipping a test
// when the machine lacks a privilege, and failing it when a feature that must
// exist on this kernel is missing, asking the kernel what it can attach, and
// the timing loop of the correlator's stream benchmarks.
package testutil
