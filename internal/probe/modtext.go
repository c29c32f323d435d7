package probe

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dnsrace/dnsrace/internal/ksym"
)

// moduleText returns the address range of module's code: its line in
// /proc/modules ("name size refs deps state address"), or, for a module
// built into the kernel, its free function's symbol range (nf_conntrack:
// nf_conntrack_free, where its entries are freed). Both need root
// (kptr_restrict shows zero addresses otherwise).
func moduleText(procRoot, module string) (lo, hi uint64, err error) {
	if procRoot == "" {
		procRoot = "/proc"
	}
	f, err := os.Open(filepath.Join(procRoot, "modules"))
	if err == nil {
		defer f.Close()
		lo, hi, found, err := parseModules(bufio.NewScanner(f), module)
		if err != nil || found {
			return lo, hi, err
		}
	}
	// Built in: the function that frees its entries.
	syms, err := ksym.Load(filepath.Join(procRoot, "kallsyms"))
	if err != nil {
		return 0, 0, err
	}
	if lo, hi, ok := syms.Range(module + "_free"); ok {
		return lo, hi, nil
	}
	return 0, 0, fmt.Errorf("%s is neither in %s/modules nor a symbol %s_free in kallsyms", module, procRoot, module)
}

// parseModules finds module's base address and size in /proc/modules.
func parseModules(sc *bufio.Scanner, module string) (lo, hi uint64, found bool, err error) {
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[0] != module {
			continue
		}
		size, err1 := strconv.ParseUint(f[1], 10, 64)
		base, err2 := strconv.ParseUint(strings.TrimPrefix(f[5], "0x"), 16, 64)
		if err1 != nil || err2 != nil {
			return 0, 0, true, fmt.Errorf("malformed /proc/modules line %q", sc.Text())
		}
		if base == 0 {
			return 0, 0, true, fmt.Errorf("/proc/modules shows %s at address 0 (not root, or kptr_restrict)", module)
		}
		return base, base + size, true, nil
	}
	return 0, 0, false, sc.Err()
}
