// Package overhead is dnsrace's overhead and capacity harness (`dnsrace bench`).
//
// It builds a namespace lab, floods it with UDP from Go (sendmmsg batches
// from a pod namespace, several sockets, bounded in count and time), counts
// what a sink in the dns namespace received, and runs the same flood with
// and without the tracer in alternating rounds so that drift cancels out.
// The tracer runs as a child process (`dnsrace trace --json`), so its CPU
// time and RSS are its own and its summary's events_lost is the kernel's
// count of records the ring buffer had no room for. A Result (results.go)
// calls them records, in its JSON keys as in its text report (report.go).
//
// Contract: every figure is measured, never asserted; the only check is
// Problems' (dnsrace bench --smoke), a correctness check: no record lost at
// a modest rate, and the DNS floods' answers followed to their queries.
// Floods only target addresses inside the lab's namespaces or loopback.
package overhead
