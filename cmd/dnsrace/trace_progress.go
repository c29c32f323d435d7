package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/probe"
	"github.com/dnsrace/dnsrace/internal/trace"
)

// This file is what dnsrace trace says on stderr while it runs: the
// tracing line once every probe is attached, and the progress line
// redrawn every second on a terminal.

// hookLabel is a hook's short name on the tracing line (--list-probes
// shows the kernel's names).
var hookLabel = map[string]string{
	"nf_conntrack_confirm": "confirm", "nf_ct_resolve_clash": "clash", "skb_consume_udp": "deliver",
	"udp_sendmsg": "send", "udpv6_sendmsg": "send6", "net_dev_queue": "xmit", "netif_receive_skb": "recv",
	"netfilter": "pre-confirm", "kfree_skb": "drop", "kmem_cache_free": "ct-free", "udp_fail_queue_rcv_skb": "rcvbuf",
}

// tracingLine says, right after start, what is traced and that dnsrace is
// waiting: on a quiet node it is the only line for a long time. It fits a
// terminal line.
func tracingLine(probes []probe.ProbeInfo, ports []uint, netns uint32) string {
	byTier := map[string][]string{}
	var tiers []string
	for _, p := range probes {
		if !p.Attached {
			continue
		}
		t := p.Tier.String()
		if byTier[t] == nil {
			tiers = append(tiers, t)
		}
		label := hookLabel[p.Hook]
		if label == "" {
			label = p.Hook
		}
		byTier[t] = append(byTier[t], label)
	}
	var hooks []string
	for _, t := range tiers {
		hooks = append(hooks, t+": "+strings.Join(byTier[t], " "))
	}
	where := "every netns"
	if netns != 0 {
		where = fmt.Sprintf("netns %d only", netns)
	}
	return fmt.Sprintf("dnsrace: tracing DNS port %s, %s (%s); waiting for stalls, Ctrl-C to stop",
		joinPorts(ports), where, strings.Join(hooks, "; "))
}

// progressLine is the progress line's text.
func progressLine(since time.Duration, l trace.Live) string {
	return fmt.Sprintf("tracing %s: %d DNS queries (%d answered, %d waiting), %d stalls, %d races rescued; %d records read, %d lost",
		since.Truncate(time.Second), l.Queries, l.Answered, l.InFlight, l.Stalls, l.Rescued, l.Events, l.EventsLost)
}

func joinPorts(ps []uint) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.FormatUint(uint64(p), 10)
	}
	return strings.Join(s, ",")
}

// progress draws one status line on a terminal, redrawn every second and
// cleared before anything else is written to the same terminal.
type progress struct {
	mu      sync.Mutex
	w       io.Writer
	started time.Time
	shown   bool
	last    string
}

func (p *progress) run(ctx context.Context, s *trace.Session) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			p.mu.Lock()
			p.clearLocked()
			p.mu.Unlock()
			return
		case <-t.C:
			line := progressLine(time.Since(p.started), s.Live())
			p.mu.Lock()
			p.last = line
			fmt.Fprintf(p.w, "\r\033[K%s", line)
			p.shown = true
			p.mu.Unlock()
		}
	}
}

func (p *progress) clearLocked() {
	if p.shown {
		fmt.Fprint(p.w, "\r\033[K")
		p.shown = false
	}
}

// clearing wraps w (the same terminal): the line is cleared before each
// write and redrawn after it.
func (p *progress) clearing(w io.Writer) io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		redraw := p.shown
		p.clearLocked()
		n, err := w.Write(b)
		if redraw {
			fmt.Fprintf(p.w, "\r\033[K%s", p.last)
			p.shown = true
		}
		return n, err
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
