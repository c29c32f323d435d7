package bpf

// Regenerate with `make generate` (mk/bpf.mk sets BPF2GO_CC, BPF2GO_STRIP and
// BPF2GO_CFLAGS). Only amd64 is generated: headers/vmlinux_arm64.h cannot be
// dumped on the x86_64 build machines (see headers/vmlinux.h).
//go:generate go tool bpf2go -tags linux -target amd64 -type event -type kind -type tier -go-package bpf Dnsrace ../../bpf/dnsrace.bpf.c -- -I../../headers -I../../bpf
