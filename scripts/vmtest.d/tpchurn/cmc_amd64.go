package tpchurn

// callCode calls the machine code at addr (no arguments) and returns RAX.
// TestCrossModifyingCode runs the instruction it rewrites through it.
func callCode(addr uintptr) uint64
