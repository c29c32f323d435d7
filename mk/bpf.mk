# BPF code generation, included from the top Makefile (include mk/bpf.mk).
#
# bpf2go compiles bpf/dnsrace.bpf.c (and the bpf/lib/ headers it includes)
# against headers/ and writes the object and Go bindings to internal/bpf/.
# The outputs are committed; CI runs
# `make generate` and fails on `git diff`, so these settings must stay what
# produced the committed files. scripts/bpf-cc runs clang so that the bytes do
# not depend on the checkout's path or on address randomisation.

BPF2GO_CC ?= $(CURDIR)/scripts/bpf-cc clang-19
BPF2GO_STRIP ?= llvm-strip-19
BPF2GO_CFLAGS ?= -O2 -g -Wall -Werror -mcpu=v2

BPF_SOURCES := $(wildcard bpf/*.c bpf/*.h bpf/lib/*.h headers/*.h)

.PHONY: generate generate-check

generate: ## Regenerate internal/bpf from bpf/ (needs clang-19, llvm-19)
	BPF2GO_CC="$(BPF2GO_CC)" BPF2GO_STRIP="$(BPF2GO_STRIP)" BPF2GO_CFLAGS="$(BPF2GO_CFLAGS)" \
		go generate ./internal/bpf/...

generate-check: generate ## Regenerate and fail if the committed objects differ
	git diff --exit-code -- internal/bpf/

.PHONY: bpf-same-code

# RENAME="old=new ..." maps symbols renamed since BASE (maps, variables, programs).
bpf-same-code: generate ## Regenerate and check every BPF instruction is as in BASE (BASE=<git rev> [RENAME="old=new ..."])
	@test -n "$(BASE)" || { echo "usage: make bpf-same-code BASE=<git rev> [RENAME=\"old=new ...\"]"; exit 2; }
	BPF2GO_STRIP="$(BPF2GO_STRIP)" BPF2GO_CFLAGS="$(BPF2GO_CFLAGS)" scripts/bpf-same-code $(BASE) $(RENAME)
