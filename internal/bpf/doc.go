// Package bpf holds the compiled BPF programs of dnsrace and the Go types
// bpf2go generated for them from bpf/dnsrace.h (-type rec_query, rec_answer,
// rec_event, ...). The .o files and *_bpfel.go files are committed, so `go
// build` needs no clang; `make generate` rebuilds them byte for byte from
// bpf/ and headers/, and CI checks that with git diff.
//
// Contract: LoadDnsrace returns the CollectionSpec of every program of every
// tier. Nothing here loads into the kernel; internal/probe chooses the
// programs, sets the "cfg" (ports, namespace, HZ) and "tracepoint_mode"
// variables and the ring buffer size, and loads only those. DnsraceRecQuery,
// DnsraceRecAnswer and DnsraceRecEvent are the raw ring buffer records
// internal/event.Decode reads.
package bpf
