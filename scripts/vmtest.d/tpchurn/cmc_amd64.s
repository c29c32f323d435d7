#include "textflag.h"

// func callCode(addr uintptr) uint64
TEXT ·callCode(SB), NOSPLIT, $0-16
	MOVQ addr+0(FP), AX
	CALL AX
	MOVQ AX, ret+8(FP)
	RET
