// Package bpf holds the compiled BPF programs of dnsrace and the Go types
// bpf2go generated for them from bpf/dnsrace.h (-type event, config, kind,
// tier). The .o files and *_bpfel.go files are committed, so `go build` needs
// no clang; `make generate` rebuilds them byte for byte from bpf/ and
// headers/, and CI checks that with git diff.
//
// Contract: LoadDnsrace returns the CollectionSpec of every program of every
// tier. Nothing here loads into the kernel; internal/probe chooses the
// programs per hook, sets the "cfg" variable and the ring buffer size, and
// loads only those. DnsraceEvent is the raw ring buffer record that
// internal/event.Decode reads.
package bpf
