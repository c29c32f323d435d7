package lab

import (
	"fmt"
	"time"
)

// Lab is a standing lab built by Up.
type Lab struct {
	Topology Topology
	servers  *servers
	cache    *cacheProc
	// active are the backends the VIP is DNATed to.
	active []int
}

// Up builds the topology and starts one DNS server per backend, configured
// by srv, inside the dns namespace. A lab with the same prefix must not be
// standing. On any failure everything built so far is torn down.
func Up(t Topology, srv ServerConfig) (*Lab, error) {
	return up(t, srv, "")
}

func up(t Topology, srv ServerConfig, failStep string) (l *Lab, err error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if err := writeState(t.statePath(), State{Topology: t, Created: time.Now()}, true); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if terr := Teardown(t.Prefix); terr != nil {
				err = fmt.Errorf("%w (and tearing down: %v)", err, terr)
			}
		}
	}()
	if err := build(t, failStep); err != nil {
		return nil, err
	}
	if failStep == "servers" {
		return nil, fmt.Errorf("building lab: step servers: injected failure")
	}
	s, err := startServers(t, srv)
	if err != nil {
		return nil, err
	}
	l = &Lab{Topology: t, servers: s, active: allBackends(t)}
	if t.Cache != "" {
		if l.cache, err = startCache(t); err != nil {
			s.close()
			return nil, err
		}
	}
	return l, nil
}

// Down stops the servers and tears the lab down.
func (l *Lab) Down() error {
	l.cache.stop()
	if l.servers != nil {
		l.servers.close()
	}
	return Teardown(l.Topology.Prefix)
}
