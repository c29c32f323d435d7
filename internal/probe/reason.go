package probe

import (
	"fmt"
	"strings"
	"sync"

	"github.com/cilium/ebpf/btf"
)

var dropReasons struct {
	once  sync.Once
	names map[uint32]string
}

// DropReasonName returns the name of an enum skb_drop_reason value of the
// running kernel without the SKB_DROP_REASON_ prefix ("NETFILTER_DROP"),
// read from the kernel's BTF, since the values differ between kernel
// versions. Unknown values give "reason(N)"; a kernel without drop reasons
// (before 5.17: no enum skb_drop_reason in its BTF) gives "".
func DropReasonName(v uint32) string {
	dropReasons.once.Do(func() {
		spec, err := btf.LoadKernelSpec()
		if err == nil {
			dropReasons.names = dropReasonNames(spec)
		}
	})
	if n, ok := dropReasons.names[v]; ok {
		return n
	}
	if len(dropReasons.names) == 0 {
		return ""
	}
	return fmt.Sprintf("reason(%d)", v)
}

// DropReasonValue is the inverse of DropReasonName: the value of the named
// reason ("NETFILTER_DROP") on the running kernel.
func DropReasonValue(name string) (uint32, bool) {
	DropReasonName(0)
	for v, n := range dropReasons.names {
		if n == name {
			return v, true
		}
	}
	return 0, false
}

func dropReasonNames(spec *btf.Spec) map[uint32]string {
	var e *btf.Enum
	if err := spec.TypeByName("skb_drop_reason", &e); err != nil {
		return nil
	}
	m := make(map[uint32]string, len(e.Values))
	for _, v := range e.Values {
		m[uint32(v.Value)] = strings.TrimPrefix(v.Name, "SKB_DROP_REASON_")
	}
	return m
}
