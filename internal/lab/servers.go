package lab

import (
	"net/netip"

	"github.com/dnsrace/dnsrace/internal/dnsserver"
	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// ServerConfig sets how the lab's DNS backends behave.
type ServerConfig struct {
	// IgnoreFraction of queries each backend leaves unanswered.
	IgnoreFraction float64 `json:"ignore_fraction,omitempty"`
	// WrongSource makes backend 0 answer from backend 1's address and
	// port (it needs two backends).
	WrongSource bool `json:"wrong_source,omitempty"`
}

type servers struct{ list []*dnsserver.Server }

func startServers(t Topology, cfg ServerConfig) (*servers, error) {
	s := &servers{}
	err := nsutil.Do(t.DNSNS(), func() error {
		for i := 0; i < t.Backends; i++ {
			c := dnsserver.Config{
				Addr:           netip.AddrPortFrom(BackendAddr(i), 53),
				IgnoreFraction: cfg.IgnoreFraction,
			}
			srv, err := dnsserver.Start(c)
			if err != nil {
				return err
			}
			s.list = append(s.list, srv)
		}
		if cfg.WrongSource && len(s.list) > 1 {
			// Backend 0 answers from backend 1's address and port 53.
			s.list[0].ReplyVia(s.list[1])
		}
		return nil
	})
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *servers) stats() dnsserver.Stats {
	var t dnsserver.Stats
	for _, srv := range s.list {
		st := srv.Stats()
		t.Received += st.Received
		t.Answered += st.Answered
		t.Ignored += st.Ignored
		t.Malformed += st.Malformed
	}
	return t
}

func (s *servers) close() {
	for _, srv := range s.list {
		srv.Close()
	}
	s.list = nil
}
