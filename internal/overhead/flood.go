package overhead

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// FloodConfig describes one bounded UDP flood.
type FloodConfig struct {
	// NS is the namespace the sending sockets live in.
	NS string
	// Dst is where every packet goes (each socket is connected to it).
	Dst netip.AddrPort
	// Sockets sending in parallel (default 2).
	Sockets int
	// Rate in packets per second over all sockets; 0 sends as fast as
	// the sockets take them.
	Rate int
	// Duration bounds the flood (required).
	Duration time.Duration
	// DNS makes every packet a DNS query (type A) with its own id and a
	// name unique over 2^32 queries; otherwise a 64-byte opaque payload.
	DNS bool
	// ReadAnswers drains and counts what comes back on each socket (DNS
	// answers from a responder).
	ReadAnswers bool
}

// FloodResult counts what one flood did.
type FloodResult struct {
	Sent       uint64        `json:"sent"`
	SendErrors uint64        `json:"send_errors"`
	Answers    uint64        `json:"answers"`
	Elapsed    time.Duration `json:"elapsed_ns"`
}

const (
	floodBatch = 64
	// dnsQueryLen: header, "\x09q%08x\x04perf\x04test\x00", type, class.
	dnsQueryLen = 12 + 10 + 5 + 5 + 1 + 4
	nameOff     = 12 + 2 // the 8 hex digits of the first label
)

// nameSeq makes every DNS query name of a process unique (mod 2^32).
var nameSeq atomic.Uint32

// buildQuery writes a DNS query for "q%08x.perf.test" with id into b.
func buildQuery(b []byte, id uint16, seq uint32) {
	binary.BigEndian.PutUint16(b[0:], id)
	binary.BigEndian.PutUint16(b[2:], 0x0100) // RD
	binary.BigEndian.PutUint16(b[4:], 1)      // QDCOUNT
	clear(b[6:12])
	b[12] = 9
	b[13] = 'q'
	putHex(b[nameOff:nameOff+8], seq)
	copy(b[22:], "\x04perf\x04test\x00")
	binary.BigEndian.PutUint16(b[33:], 1) // A
	binary.BigEndian.PutUint16(b[35:], 1) // IN
}

func putHex(b []byte, v uint32) {
	const digits = "0123456789abcdef"
	for i := 7; i >= 0; i-- {
		b[i] = digits[v&0xf]
		v >>= 4
	}
}

// Flood sends until cfg.Duration has passed or ctx ends, then returns
// what it sent. It leaves no socket open.
func Flood(ctx context.Context, cfg FloodConfig) (FloodResult, error) {
	if cfg.Duration <= 0 {
		return FloodResult{}, errors.New("starting a flood: FloodConfig.Duration must be positive")
	}
	if cfg.Sockets <= 0 {
		cfg.Sockets = 2
	}
	fds := make([]int, 0, cfg.Sockets)
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for range cfg.Sockets {
		fd, err := udpSocket(cfg.NS, netip.AddrPort{}, cfg.Dst)
		if err != nil {
			return FloodResult{}, fmt.Errorf("opening a flood socket: %w", err)
		}
		fds = append(fds, fd)
	}
	var (
		sent, errs, answers atomic.Uint64
		wg                  sync.WaitGroup
		stop                atomic.Bool
	)
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	perSock := float64(cfg.Rate) / float64(cfg.Sockets)
	for i, fd := range fds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, e := sendLoop(ctx, fd, cfg.DNS, uint16(i)<<12, perSock, start, deadline)
			sent.Add(n)
			errs.Add(e)
		}()
		if cfg.ReadAnswers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				answers.Add(drain(fd, &stop))
			}()
		}
	}
	// Let late answers arrive before the readers stop.
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(deadline) + 300*time.Millisecond):
		}
		stop.Store(true)
		close(done)
	}()
	wg.Wait()
	<-done
	return FloodResult{Sent: sent.Load(), SendErrors: errs.Load(), Answers: answers.Load(), Elapsed: time.Since(start)}, nil
}

// sendLoop is one socket's sender; rate 0 means unpaced.
func sendLoop(ctx context.Context, fd int, dns bool, idBase uint16, rate float64, start, deadline time.Time) (sent, errs uint64) {
	m := newMmsg(floodBatch, 64, false)
	if dns {
		m.setLen(dnsQueryLen)
	}
	id := idBase
	for {
		now := time.Now()
		if !now.Before(deadline) || ctx.Err() != nil {
			return sent, errs
		}
		k := floodBatch
		if rate > 0 {
			due := int64(rate*now.Sub(start).Seconds()) - int64(sent)
			if due <= 0 {
				time.Sleep(200 * time.Microsecond)
				continue
			}
			k = int(min(due, floodBatch))
		}
		if dns {
			for i := range k {
				id++
				buildQuery(m.bufs[i], id, nameSeq.Add(1))
			}
		}
		n, err := sendmmsg(fd, m.hdrs[:k])
		sent += uint64(n)
		if err != nil && !errors.Is(err, unix.EAGAIN) {
			// ECONNREFUSED (an ICMP error from an earlier packet),
			// ENOBUFS: count and go on.
			errs++
		}
	}
}

// drain counts datagrams arriving on fd until stop is set.
func drain(fd int, stop *atomic.Bool) uint64 {
	m := newMmsg(floodBatch, 512, false)
	var n uint64
	for !stop.Load() {
		m.prepRecv()
		k, err := recvmmsg(fd, m.hdrs)
		if err != nil {
			continue
		}
		n += uint64(k)
	}
	return n
}
