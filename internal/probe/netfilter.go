package probe

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sort"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/bpf"
	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// HookNetfilter names the netfilter program's hook in Probes.
const HookNetfilter = "netfilter"

// confirmPriority is just before conntrack's confirm (NF_IP_PRI_LAST,
// INT_MAX, which a BPF link may not take): after every NAT rule, before the
// verdict on the entry.
const confirmPriority = math.MaxInt32 - 1

// nfHooks are where confirm runs: POSTROUTING for what leaves the
// namespace (forwarded or sent locally), LOCAL_IN for what a local socket
// receives; IPv4 and IPv6.
var nfHooks = []struct {
	pf   link.NetfilterProtocolFamily
	hook link.NetfilterInetHook
}{
	{link.NetfilterProtoIPv4, link.NetfilterInetPostRouting},
	{link.NetfilterProtoIPv4, link.NetfilterInetLocalIn},
	{link.NetfilterProtoIPv6, link.NetfilterInetPostRouting},
	{link.NetfilterProtoIPv6, link.NetfilterInetLocalIn},
}

// netfilter loads the program the tracepoint tier runs just before confirm
// (6.4+: BPF_PROG_TYPE_NETFILTER) and proves it attaches by linking it in
// this process's own namespace and letting go. With it, merged clash losers
// are seen without a program on every slab free (kmem_cache_free). Its
// links are made per namespace by WatchNetNS.
func (l *loader) netfilter() {
	info := ProbeInfo{Hook: HookNetfilter, Tier: event.TierTracepoint, Program: bpf.DnsraceProgNfConfirmSoon}
	err := l.loadNetfilter()
	if err != nil {
		info.Tier, info.Err = event.TierNone, err
	} else {
		info.Attached = true
	}
	l.t.probes = append(l.t.probes, info)
}

func (l *loader) loadNetfilter() error {
	if err := features.HaveProgramType(ebpf.Netfilter); err != nil {
		return fmt.Errorf("no netfilter BPF programs before Linux 6.4 (CONFIG_NETFILTER_BPF_LINK): %w", err)
	}
	coll, err := l.load(bpf.DnsraceProgNfConfirmSoon)
	if err != nil {
		return explain(fmt.Errorf("loading %s: %w", bpf.DnsraceProgNfConfirmSoon, err))
	}
	prog := coll.Programs[bpf.DnsraceProgNfConfirmSoon]
	lk, err := link.AttachNetfilter(link.NetfilterOptions{Program: prog, ProtocolFamily: nfHooks[0].pf, Hook: nfHooks[0].hook, Priority: confirmPriority})
	if err != nil {
		coll.Close()
		return fmt.Errorf("attaching %s: %w", bpf.DnsraceProgNfConfirmSoon, err)
	}
	lk.Close()
	l.t.colls = append(l.t.colls, coll)
	l.t.nfProg = prog
	return nil
}

// watched is one namespace's netfilter links.
type watched struct {
	links []link.Link
}

// HasNetfilter reports whether the netfilter program is loaded (the
// tracepoint tier on 6.4+): namespaces must then be watched (WatchNetNS)
// for merged clash losers to be seen there.
func (t *Tracer) HasNetfilter() bool { return t.nfProg != nil }

// WatchNetNS links the netfilter program in the namespace with inode ino,
// opened at path (/run/netns/NAME, /proc/PID/ns/net), just before confirm.
// Watching a namespace twice does nothing; without the program it is an
// error.
//
// A netfilter link holds its namespace: a namespace deleted while watched
// lives on until Unwatch (or Close) lets it go.
func (t *Tracer) WatchNetNS(ino uint32, path string) error {
	t.closeMu.Lock()
	defer t.closeMu.Unlock()
	if t.closed {
		return errors.New("tracer closed")
	}
	if t.nfProg == nil {
		return errors.New("no netfilter program: the tracepoint tier on Linux 6.4+ only")
	}
	if _, ok := t.watched[ino]; ok {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("opening network namespace %d: %w", ino, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return err
	}
	if uint32(st.Ino) != ino {
		return fmt.Errorf("%s is namespace %d, not %d", path, st.Ino, ino)
	}
	w := &watched{}
	err = nsutil.DoHandle(netns.NsHandle(int(f.Fd())), func() error {
		for _, h := range nfHooks {
			lk, err := link.AttachNetfilter(link.NetfilterOptions{Program: t.nfProg, ProtocolFamily: h.pf, Hook: h.hook, Priority: confirmPriority})
			if err != nil {
				return fmt.Errorf("linking %s in namespace %d: %w", bpf.DnsraceProgNfConfirmSoon, ino, err)
			}
			w.links = append(w.links, lk)
		}
		return nil
	})
	if err != nil {
		for _, lk := range w.links {
			lk.Close()
		}
		return err
	}
	if t.watched == nil {
		t.watched = map[uint32]*watched{}
	}
	t.watched[ino] = w
	return nil
}

// UnwatchNetNS removes the namespace's links (a no-op if not watched).
func (t *Tracer) UnwatchNetNS(ino uint32) {
	t.closeMu.Lock()
	defer t.closeMu.Unlock()
	if w, ok := t.watched[ino]; ok {
		for _, lk := range w.links {
			lk.Close()
		}
		delete(t.watched, ino)
	}
}

// Watched lists the watched namespaces' inodes, in order.
func (t *Tracer) Watched() []uint32 {
	t.closeMu.RLock()
	defer t.closeMu.RUnlock()
	out := make([]uint32, 0, len(t.watched))
	for ino := range t.watched {
		out = append(out, ino)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
