package bpf

// Regenerate with `make generate` (mk/bpf.mk sets BPF2GO_CC, BPF2GO_STRIP and
// BPF2GO_CFLAGS). Arch targets, not bpfel: the kprobe programs read pt_regs.
//go:generate go tool bpf2go -tags linux -target amd64,arm64 -type rec_hdr -type rec_query -type rec_answer -type rec_event -type rec_type -type ev_kind -type tier -type rec_flags -type stat_index -type sweep_io -type sweep_table -go-package bpf Dnsrace ../../bpf/dnsrace.bpf.c -- -I../../headers -I../../bpf
