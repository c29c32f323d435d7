// Package overhead is dnsrace's overhead and capacity harness (`dnsrace bench`).
//
// It builds a namespace lab, floods it with UDP from Go (sendmmsg batches
// from a pod namespace, several sockets, bounded in count and time), counts
// what a sink in the dns namespace received, and runs the same flood with
// and without the tracer in alternating rounds so that drift cancels out.
// The tracer runs as a child process (`dnsrace trace --json`), so its CPU
// time and RSS are its own and its summary's events_lost is the kernel's
// count of events the ring buffer had no room for.
//
// Contract: every figure is measured, never asserted; the only check is
// Smoke's, a correctness check (no lost events at a modest rate). Floods
// only target addresses inside the lab's namespaces or loopback.
package overhead
