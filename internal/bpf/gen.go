package bpf

// Regenerate with `make generate` (mk/bpf.mk sets BPF2GO_CC, BPF2GO_STRIP and
// BPF2GO_CFLAGS). Arch targets, not bpfel: the kprobe programs read pt_regs.
//go:generate go tool bpf2go -tags linux -target amd64,arm64 -type event -type kind -type tier -go-package bpf Dnsrace ../../bpf/dnsrace.bpf.c -- -I../../headers -I../../bpf
