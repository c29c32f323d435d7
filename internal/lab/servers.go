package lab

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/dnsserver"
	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// Server kinds.
const (
	ServerBuiltin = "builtin"
	// ServerDnsmasq runs real dnsmasq, one per backend address.
	ServerDnsmasq = "dnsmasq"
)

// ServerConfig sets how the lab's DNS backends behave.
type ServerConfig struct {
	// Kind is ServerBuiltin (default) or ServerDnsmasq.
	Kind string `json:"kind,omitempty"`
	// IgnoreFraction of queries each backend leaves unanswered.
	IgnoreFraction float64 `json:"ignore_fraction,omitempty"`
	// WrongSource makes backend 0 answer from backend 1's address and
	// port (it needs two backends).
	WrongSource bool `json:"wrong_source,omitempty"`
}

type servers struct {
	cfg   ServerConfig
	list  []*dnsserver.Server
	procs []*exec.Cmd
	exits []<-chan error
	// byBackend: backend pods' servers (Topology.BackendPods).
	byBackend map[int]*dnsserver.Server
}

func startServers(t Topology, cfg ServerConfig) (*servers, error) {
	if cfg.Kind == ServerDnsmasq {
		return startDnsmasq(t, cfg)
	}
	s := &servers{cfg: cfg, byBackend: map[int]*dnsserver.Server{}}
	if t.BackendPods {
		for i := 0; i < t.Backends; i++ {
			srv, err := startBackendPod(t, i, cfg)
			if err != nil {
				s.close()
				return nil, err
			}
			s.byBackend[i] = srv
		}
		return s, nil
	}
	err := nsutil.Do(t.DNSNS(), func() error {
		for i := 0; i < t.Backends; i++ {
			c := dnsserver.Config{
				Addr:           netip.AddrPortFrom(BackendAddr(i), t.Port()),
				IgnoreFraction: cfg.IgnoreFraction,
			}
			srv, err := dnsserver.Start(c)
			if err != nil {
				return err
			}
			s.list = append(s.list, srv)
		}
		if cfg.WrongSource && len(s.list) > 1 {
			// Backend 0 answers from backend 1's address and port.
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
	for _, srv := range slices.Concat(s.list, slices.Collect(maps.Values(s.byBackend))) {
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
	for _, srv := range s.byBackend {
		srv.Close()
	}
	s.list, s.byBackend = nil, nil
	for i, c := range s.procs {
		_ = c.Cancel()
		<-s.exits[i]
	}
	s.procs, s.exits = nil, nil
}

// startDnsmasq runs one real dnsmasq per backend address in the dns
// namespace, authoritative for lab.test with the same answers as the
// built-in server. It cannot misbehave on purpose and keeps no counts the
// lab can read, so the scenarios that need either refuse it.
func startDnsmasq(t Topology, cfg ServerConfig) (*servers, error) {
	if cfg.IgnoreFraction > 0 || cfg.WrongSource {
		return nil, errors.New("dnsmasq cannot ignore queries or answer from another address: use the builtin server for this scenario")
	}
	bin, err := exec.LookPath("dnsmasq")
	if err != nil {
		return nil, fmt.Errorf("dnsmasq not installed (apt-get install dnsmasq-base): %w", err)
	}
	s := &servers{}
	for i := 0; i < t.Backends; i++ {
		addr := BackendAddr(i)
		c := dnsmasqCommand(t.DNSNS(), bin, "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
			"--bind-interfaces", "--listen-address="+addr.String(), fmt.Sprintf("--port=%d", t.Port()), "--user=root", "--group=root",
			"--pid-file=", "--address=/lab.test/"+dnsserver.AnswerA.String(), "--address=/lab.test/"+dnsserver.AnswerAAAA.String())
		c.Stderr = os.Stderr
		exited, err := nsutil.Start(c)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("starting dnsmasq on %s: %w", addr, err)
		}
		s.procs, s.exits = append(s.procs, c), append(s.exits, exited)
	}
	// dnsmasq binds at start; wait until every backend answers.
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < t.Backends; i++ {
		for !listening(t.DNSNS(), netip.AddrPortFrom(BackendAddr(i), t.Port())) {
			if time.Now().After(deadline) {
				s.close()
				return nil, fmt.Errorf("dnsmasq on %s did not start listening", BackendAddr(i))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return s, nil
}

func dnsmasqCommand(ns string, argv ...string) *exec.Cmd {
	return nsutil.Command(context.Background(), ns, argv...)
}

// listening reports whether something is bound to addr/udp in namespace
// ns (a bind test: it fails while the port is taken).
func listening(ns string, addr netip.AddrPort) bool {
	taken := false
	_ = nsutil.Do(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		err = unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.Addr().As4(), Port: int(addr.Port())})
		taken = errors.Is(err, unix.EADDRINUSE)
		return nil
	})
	return taken
}
