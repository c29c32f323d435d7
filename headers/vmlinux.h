/* Dispatches to the BTF dump of the target architecture.
 *
 * vmlinux_x86.h is `bpftool btf dump file /sys/kernel/btf/vmlinux format c`
 * of an x86_64 6.18 kernel (scripts/update-headers --vmlinux); vmlinux_arm64.h
 * is the BTF of Debian's arm64 6.1.0-57 cloud kernel, cut out of its Image
 * (scripts/update-headers --vmlinux-arm64). Programs use
 * CO-RE, so the dump only has to name the types and fields they read; the
 * loader relocates every access against the running kernel's BTF.
 */
#if defined(__TARGET_ARCH_x86)
#include "vmlinux_x86.h"
#elif defined(__TARGET_ARCH_arm64)
#if __has_include("vmlinux_arm64.h")
#include "vmlinux_arm64.h"
#else
#error "headers/vmlinux_arm64.h is missing: run scripts/update-headers --vmlinux on an arm64 machine with /sys/kernel/btf/vmlinux (the arm64 pt_regs layout differs, so the x86 dump cannot stand in)"
#endif
#else
#error "unsupported target: build with bpf2go -target amd64 (or arm64 once headers/vmlinux_arm64.h exists)"
#endif
