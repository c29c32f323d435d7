# Kernel matrix: the fentry and kprobe attach tiers tested in Debian kernels under qemu.
# Included by the top Makefile; also usable alone: make -f mk/vmtest.mk vmtest. See docs/vmtest.md.

GO ?= go
# sudo resets PATH (secure_path); Go's usual home keeps working under it.
export PATH := $(PATH):/usr/local/go/bin
# Built, not go run: go run turns every failure into exit status 1, the harness says 2 for a setup error.
VMTEST ?= bin/vmtest
# Extra arguments, e.g. VMTEST_ARGS="--only 6.1" or test binary specs NAME=PATH[:PATTERN][@TIERS].
VMTEST_ARGS ?=

.PHONY: vmtest vmtest-full vmtest-build

vmtest-build:
	CGO_ENABLED=0 $(GO) build -o bin/vmtest ./cmd/vmtest

vmtest: vmtest-build ## Run the test binaries in every kernel of scripts/kernels.txt under qemu (root; writes .cache/vmtest)
	$(VMTEST) $(VMTEST_ARGS)

# The full matrix boots a guest per kernel and tier: three trace suites of about 230 s each under TCG.
vmtest-full: vmtest-build ## The same with the full matrix: every trace scenario in every tier on every kernel (past the CI budget; root)
	$(VMTEST) --full --split "fentry kprobe tracepoint,any" $(VMTEST_ARGS)
