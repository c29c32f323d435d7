package ctentry

import (
	"bufio"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ParseList reads entries from the text `conntrack -L` prints (with or
// without -o extended) or /proc/net/nf_conntrack holds: one entry a line,
// "udp 17 29 src=A dst=B sport=P dport=Q [UNREPLIED] src=... mark=0 use=1".
// The text has no status word for NAT: DstNAT and SrcNAT are set when the
// reply tuple is not the original one mirrored, as the kernel sets them.
// It has no start time either. Lines that do not parse are counted in bad.
func ParseList(text string) (entries []Entry, bad int) {
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "conntrack v") {
			continue
		}
		e, ok := parseLine(line)
		if !ok {
			bad++
			continue
		}
		entries = append(entries, e)
	}
	return entries, bad
}

// tupleKeys are the keys of a tuple, each once per direction.
var tupleKeys = []string{"src", "dst", "sport", "dport"}

func parseLine(line string) (Entry, bool) {
	var e Entry
	f := strings.Fields(line)
	if len(f) > 0 && (f[0] == "ipv4" || f[0] == "ipv6") {
		f = f[min(2, len(f)):]
	}
	if len(f) < 3 {
		return e, false
	}
	proto, err := strconv.ParseUint(f[1], 10, 8)
	if err != nil {
		return e, false
	}
	timeout, err := strconv.ParseUint(f[2], 10, 32)
	if err != nil {
		return e, false
	}
	var addrs [2][2]netip.Addr // [orig, reply][src, dst]
	var ports [2][2]uint16
	var seen [4]int // src, dst, sport, dport: how many of each so far
	unreplied, assured := false, false
	for _, w := range f[3:] {
		switch w {
		case "[UNREPLIED]":
			unreplied = true
			continue
		case "[ASSURED]":
			assured = true
			continue
		}
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			continue // a TCP state, [OFFLOAD], [start=...]
		}
		i := slices.Index(tupleKeys, k)
		if i < 0 {
			switch k {
			case "mark":
				if n, err := strconv.ParseUint(v, 10, 32); err == nil {
					e.Mark = uint32(n)
				}
			case "zone":
				if n, err := strconv.ParseUint(v, 10, 16); err == nil {
					e.Zone = uint16(n)
				}
			}
			continue
		}
		dir := seen[i]
		if dir > 1 {
			return e, false
		}
		seen[i]++
		if i < 2 {
			a, err := netip.ParseAddr(v)
			if err != nil {
				return e, false
			}
			addrs[dir][i] = a
		} else {
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil {
				return e, false
			}
			ports[dir][i-2] = uint16(n)
		}
	}
	if seen[0] != 2 || seen[1] != 2 || seen[2] != seen[3] || seen[2] == 1 {
		return e, false
	}
	for d, t := range []*Tuple{&e.Orig, &e.Reply} {
		t.Src = netip.AddrPortFrom(addrs[d][0], ports[d][0])
		t.Dst = netip.AddrPortFrom(addrs[d][1], ports[d][1])
		t.Proto = uint8(proto)
	}
	e.Timeout = time.Duration(timeout) * time.Second
	e.Status = Confirmed
	if !unreplied {
		e.Status |= SeenReply
	}
	if assured {
		e.Status |= Assured
	}
	if e.Reply.Src != e.Orig.Dst {
		e.Status |= DstNAT
	}
	if e.Reply.Dst != e.Orig.Src {
		e.Status |= SrcNAT
	}
	return e, true
}
