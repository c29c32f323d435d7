package natrules

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// maxNotes caps the notes one source adds: a ruleset a reader does not
// understand would otherwise repeat the same note per rule.
const maxNotes = 20

// DNSPort is the port whose services DNS lists.
const DNSPort = 53

// Service is one VIP the rules DNAT and the backends they pick from.
type Service struct {
	// VIP is the destination the rules match; port 0 when they match the
	// address whatever the port.
	VIP netip.AddrPort
	// Proto is the layer 4 protocol (unix.IPPROTO_UDP, _TCP); 0 when the
	// rules match any.
	Proto uint8
	// Backends are the DNAT targets, sorted; a port 0 keeps the packet's
	// destination port (a DNAT without a port).
	Backends []netip.AddrPort
	// Source says which rules: "nftables ip kube-proxy",
	// "iptables-nft-save nat", several joined by ", ".
	Source string
}

// Key returns "10.96.0.10:53/udp" (":*" for any port, "/any" for any
// protocol).
func (s Service) Key() string { return vipString(s.VIP, s.Proto) }

func vipString(vip netip.AddrPort, proto uint8) string {
	port := "*"
	if vip.Port() != 0 {
		port = fmt.Sprint(vip.Port())
	}
	host := vip.Addr().String()
	if vip.Addr().Is6() {
		host = "[" + host + "]"
	}
	return host + ":" + port + "/" + ProtoName(proto)
}

// ProtoName returns "udp", "tcp", "sctp", "icmp", "any" for 0, or the number.
func ProtoName(p uint8) string {
	switch p {
	case 0:
		return "any"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	}
	return fmt.Sprint(p)
}

type svcKey struct {
	addr  netip.Addr
	port  uint16
	proto uint8
}

type svcVal struct {
	backends map[netip.AddrPort]bool
	sources  []string
}

// Table is what the NAT rules of one namespace DNAT, read at one moment.
type Table struct {
	services map[svcKey]*svcVal
	// Sources lists what was read ("nftables (netlink): 2 tables",
	// "iptables-nft-save: 41 nat rules").
	Sources []string
	// Notes are rules that were not understood and sources that could not
	// be read while others could. A DNAT hidden in them is missing from
	// the table.
	Notes []string
}

func newTable() *Table { return &Table{services: map[svcKey]*svcVal{}} }

func (t *Table) add(source string, p pkt, to netip.AddrPort) {
	if !p.addr.IsValid() {
		return
	}
	k := svcKey{p.addr.Unmap(), p.port, p.proto}
	v := t.services[k]
	if v == nil {
		v = &svcVal{backends: map[netip.AddrPort]bool{}}
		t.services[k] = v
	}
	if !to.Addr().IsValid() { // a dnat that only changes the port
		to = netip.AddrPortFrom(p.addr, to.Port())
	}
	if to.Port() == 0 && p.port != 0 {
		to = netip.AddrPortFrom(to.Addr(), p.port)
	}
	v.backends[netip.AddrPortFrom(to.Addr().Unmap(), to.Port())] = true
	if !slices.Contains(v.sources, source) {
		v.sources = append(v.sources, source)
	}
}

// merge adds o's services, sources and notes to t.
func (t *Table) merge(o *Table) {
	for k, ov := range o.services {
		v := t.services[k]
		if v == nil {
			v = &svcVal{backends: map[netip.AddrPort]bool{}}
			t.services[k] = v
		}
		for b := range ov.backends {
			v.backends[b] = true
		}
		for _, s := range ov.sources {
			if !slices.Contains(v.sources, s) {
				v.sources = append(v.sources, s)
			}
		}
	}
	t.Sources = append(t.Sources, o.Sources...)
	t.Notes = append(t.Notes, o.Notes...)
}

// Backends returns the backends the rules DNAT vip (with protocol proto)
// to now, sorted, and which rules say so. Rules that match the address for
// any port or any protocol count too. ok is false when no rule DNATs vip.
func (t *Table) Backends(vip netip.AddrPort, proto uint8) (backends []netip.AddrPort, source string, ok bool) {
	if t == nil {
		return nil, "", false
	}
	addr := vip.Addr().Unmap()
	ports, protos := []uint16{vip.Port()}, []uint8{proto}
	if vip.Port() != 0 {
		ports = append(ports, 0)
	}
	if proto != 0 {
		protos = append(protos, 0)
	}
	set := map[netip.AddrPort]bool{}
	var sources []string
	for _, port := range ports {
		for _, pr := range protos {
			v := t.services[svcKey{addr, port, pr}]
			if v == nil {
				continue
			}
			ok = true
			for b := range v.backends {
				if b.Port() == 0 {
					b = netip.AddrPortFrom(b.Addr(), vip.Port())
				}
				set[b] = true
			}
			for _, s := range v.sources {
				if !slices.Contains(sources, s) {
					sources = append(sources, s)
				}
			}
		}
	}
	for b := range set {
		backends = append(backends, b)
	}
	slices.SortFunc(backends, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return backends, strings.Join(sources, ", "), ok
}

// Services returns every service the rules DNAT, sorted by VIP then
// protocol.
func (t *Table) Services() []Service {
	if t == nil {
		return nil
	}
	out := make([]Service, 0, len(t.services))
	for k, v := range t.services {
		s := Service{VIP: netip.AddrPortFrom(k.addr, k.port), Proto: k.proto, Source: strings.Join(v.sources, ", ")}
		for b := range v.backends {
			s.Backends = append(s.Backends, b)
		}
		slices.SortFunc(s.Backends, func(a, b netip.AddrPort) int { return a.Compare(b) })
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Service) int {
		return cmp.Or(a.VIP.Compare(b.VIP), cmp.Compare(a.Proto, b.Proto))
	})
	return out
}

// DNS returns the services that take DNS queries: VIP port 53, or any port
// of an address, over UDP, TCP or any protocol.
func (t *Table) DNS() []Service {
	var out []Service
	for _, s := range t.Services() {
		p := s.VIP.Port()
		if (p == DNSPort || p == 0) && (s.Proto == 0 || s.Proto == unix.IPPROTO_UDP || s.Proto == unix.IPPROTO_TCP) {
			out = append(out, s)
		}
	}
	return out
}
