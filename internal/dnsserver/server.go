package dnsserver

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/miekg/dns"
)

// Answers every name is given.
var (
	AnswerA    = netip.MustParseAddr("192.0.2.53")
	AnswerAAAA = netip.MustParseAddr("2001:db8::53")
)

// Config sets one server's behaviour.
type Config struct {
	// Addr is the address and port to bind, e.g. 10.96.100.11:53.
	Addr netip.AddrPort
	// IgnoreFraction of queries (0..1) get no answer at all.
	IgnoreFraction float64
	// ReplyFrom, when set, is bound too and every reply leaves from it
	// instead of Addr. (To answer from another server's address and port,
	// use ReplyVia.)
	ReplyFrom netip.AddrPort
	// TTL of the answers, in seconds.
	TTL uint32
}

// Stats counts what a server saw. All fields are totals since Start.
type Stats struct {
	Received  uint64 `json:"received"`
	Answered  uint64 `json:"answered"`
	Ignored   uint64 `json:"ignored"`
	Malformed uint64 `json:"malformed"`
}

// Server is one running server.
type Server struct {
	cfg                                    Config
	conn                                   *net.UDPConn
	replyConn                              atomic.Pointer[net.UDPConn]
	ownReply                               *net.UDPConn
	received, answered, ignored, malformed atomic.Uint64
	wg                                     sync.WaitGroup
}

// Start binds the server's sockets in the caller's network namespace and
// serves until Close. Sockets keep the namespace they were made in, so the
// caller may bind inside a namespace and serve from anywhere.
func Start(cfg Config) (*Server, error) {
	if cfg.TTL == 0 {
		cfg.TTL = 30
	}
	s := &Server{cfg: cfg}
	var err error
	s.conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(cfg.Addr))
	if err != nil {
		return nil, fmt.Errorf("binding DNS server to %s: %w", cfg.Addr, err)
	}
	s.replyConn.Store(s.conn)
	if cfg.ReplyFrom.IsValid() {
		s.ownReply, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(cfg.ReplyFrom))
		if err != nil {
			s.conn.Close()
			return nil, fmt.Errorf("binding reply socket to %s: %w", cfg.ReplyFrom, err)
		}
		s.replyConn.Store(s.ownReply)
	}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

func (s *Server) serve() {
	defer s.wg.Done()
	buf := make([]byte, 65535)
	var q, r dns.Msg
	for {
		n, from, err := s.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		s.received.Add(1)
		if err := q.Unpack(buf[:n]); err != nil || len(q.Question) != 1 || q.Response {
			s.malformed.Add(1)
			continue
		}
		if s.cfg.IgnoreFraction > 0 && rand.Float64() < s.cfg.IgnoreFraction {
			s.ignored.Add(1)
			continue
		}
		s.answer(&q, &r)
		out, err := r.PackBuffer(buf)
		if err != nil {
			continue
		}
		if _, err := s.replyConn.Load().WriteToUDPAddrPort(out, from); err == nil {
			s.answered.Add(1)
		}
	}
}

func (s *Server) answer(q, r *dns.Msg) {
	r.SetReply(q)
	r.Authoritative = true
	r.Answer = r.Answer[:0]
	question := q.Question[0]
	hdr := dns.RR_Header{Name: question.Name, Class: dns.ClassINET, Ttl: s.cfg.TTL, Rrtype: question.Qtype}
	switch question.Qtype {
	case dns.TypeA:
		r.Answer = append(r.Answer, &dns.A{Hdr: hdr, A: AnswerA.AsSlice()})
	case dns.TypeAAAA:
		r.Answer = append(r.Answer, &dns.AAAA{Hdr: hdr, AAAA: AnswerAAAA.AsSlice()})
	}
}

// ReplyVia makes s send every reply through other's socket, so replies
// leave from other's address and port: a server answering from the wrong
// address, as one bound to 0.0.0.0 on a multi-homed host does.
func (s *Server) ReplyVia(other *Server) { s.replyConn.Store(other.conn) }

// Stats returns the counters so far.
func (s *Server) Stats() Stats {
	return Stats{
		Received:  s.received.Load(),
		Answered:  s.answered.Load(),
		Ignored:   s.ignored.Load(),
		Malformed: s.malformed.Load(),
	}
}

// Close stops the server and waits for its loop to end.
func (s *Server) Close() error {
	err := s.conn.Close()
	if s.ownReply != nil {
		s.ownReply.Close()
	}
	s.wg.Wait()
	return err
}
