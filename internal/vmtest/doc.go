// Package vmtest runs dnsrace's privileged test binaries inside Debian
// distribution kernels under qemu and reports a kernel × tier × suite matrix.
//
// The host kernel refuses fentry and has no kprobes, so those attach tiers
// are tested in guests: each kernel of scripts/kernels.txt is fetched with
// apt (an apt of the harness's own, so the host's apt is never touched),
// booted with a busybox initramfs that carries the test binaries, and every
// suite runs once per tier with DNSRACE_TEST_TIER set. The guest wraps each
// run in test2json, so the host reads test events, not text; one marker line
// before and after each run (VMTEST-CELL, VMTEST-END) tells the cells apart
// on the serial console.
//
// The package has three layers, each testable without qemu:
//   - the plan (plan.go): kernels.txt, suites.txt and test binary specs to
//     the guests to boot, with their tiers;
//   - the console (console.go): a guest's console log to its cells, failed
//     tests, output and RUNS lines;
//   - the report (report.go): the matrix, the runs table and the JSON.
//
// Fetching (apt.go, kernel.go), the initramfs (initramfs.go, cpio.go) and
// qemu (qemu.go) need a Debian host; Run (run.go) ties them together.
// docs/vmtest.md is the manual.
package vmtest
