package overhead

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Sink counts the datagrams arriving at one address inside a namespace;
// with Answer it is also a minimal DNS responder: every datagram goes back
// to its sender with the QR bit set (an answer to the correlator).
type Sink struct {
	fd       int
	received atomic.Uint64
	answered atomic.Uint64
	stop     atomic.Bool
	wg       sync.WaitGroup
}

// StartSink binds one socket to addr in ns, read by workers goroutines,
// and counts. Not one SO_REUSEPORT socket per worker: the kernel spreads
// flows over those by hash, so two sending sockets' flows can land on one
// socket, which halves the responder, overflows its buffer and makes the
// floods' rounds bimodal.
func StartSink(ns string, addr netip.AddrPort, answer bool, workers int) (*Sink, error) {
	if workers <= 0 {
		workers = 2
	}
	fd, err := udpSocket(ns, addr, netip.AddrPort{})
	if err != nil {
		return nil, fmt.Errorf("opening the sink's socket: %w", err)
	}
	s := &Sink{fd: fd}
	for range workers {
		s.wg.Add(1)
		go s.loop(fd, answer)
	}
	return s, nil
}

func (s *Sink) loop(fd int, answer bool) {
	defer s.wg.Done()
	m := newMmsg(floodBatch, 2048, answer)
	for !s.stop.Load() {
		m.prepRecv()
		n, err := recvmmsg(fd, m.hdrs)
		if err != nil || n <= 0 {
			continue
		}
		s.received.Add(uint64(n))
		if !answer {
			continue
		}
		for i := range n {
			l := int(m.hdrs[i].Len)
			if l >= 12 {
				m.bufs[i][2] |= 0x80 // QR: a response
			}
			m.iovs[i].SetLen(l)
		}
		if k, err := sendmmsg(fd, m.hdrs[:n]); err == nil {
			s.answered.Add(uint64(k))
		}
	}
}

// Received is the number of datagrams counted so far.
func (s *Sink) Received() uint64 { return s.received.Load() }

// Answered is the number of answers sent so far.
func (s *Sink) Answered() uint64 { return s.answered.Load() }

// Close stops the workers and closes the sockets.
func (s *Sink) Close() {
	s.stop.Store(true)
	s.wg.Wait()
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}
