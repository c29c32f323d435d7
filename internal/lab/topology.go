package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// Fixed addresses of the lab. They live only inside the lab's namespaces.
var (
	VIP        = netip.MustParseAddr("10.96.0.10")
	NodeUplink = netip.MustParsePrefix("10.96.100.1/24")
	PodGateway = netip.MustParsePrefix("10.244.0.1/24")
	podNet     = netip.MustParsePrefix("10.244.0.0/24")
)

// BackendAddr returns the address of DNS backend i.
func BackendAddr(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 96, 100, byte(11 + i)}) }

// PodAddr returns pod i's IPv4 address.
func PodAddr(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, 0, byte(10 + i)}) }

// PodAddr6 returns pod i's IPv6 address. Pods need one so that glibc's
// AI_ADDRCONFIG asks for AAAA too, as it does on a dual-stack node.
func PodAddr6(i int) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfd, 0, 2, 0x44, 14: 0, 15: byte(0x10 + i)})
}

// Limits of the lab's size: pods and backends get host numbers in one /24.
const (
	MaxPods     = 200
	MaxBackends = 40
)

// PortRange is an inclusive range of UDP ports for SNAT.
type PortRange struct{ Min, Max uint16 }

func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.Min, r.Max) }

// Set parses "MIN-MAX" (a pflag.Value).
func (r *PortRange) Set(s string) error {
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		hi = lo
	}
	a, err1 := strconv.ParseUint(lo, 10, 16)
	b, err2 := strconv.ParseUint(hi, 10, 16)
	if err1 != nil || err2 != nil || a == 0 {
		return fmt.Errorf("port range %q: want MIN-MAX with ports 1-65535", s)
	}
	if a > b {
		return fmt.Errorf("port range %q is reversed: %d > %d", s, a, b)
	}
	r.Min, r.Max = uint16(a), uint16(b)
	return nil
}

func (r *PortRange) Type() string { return "MIN-MAX" }

// Topology is the shape of one lab.
type Topology struct {
	Prefix   string `json:"prefix"`
	Pods     int    `json:"pods"`
	Backends int    `json:"backends"`
	// SNAT rewrites the source of queries leaving toward the backends to
	// the node's uplink address (the pod's own with LocalNAT) and a port
	// from SNATPorts, as a node that masquerades pod traffic does.
	SNAT        bool      `json:"snat"`
	SNATPorts   PortRange `json:"snat_ports"`
	RandomFully bool      `json:"random_fully"`
	// UDPTimeout sets nf_conntrack_udp_timeout in the namespaces that NAT
	// (seconds; 0 keeps the kernel's default). Short timeouts recycle SNAT
	// ports fast.
	UDPTimeout int `json:"udp_timeout"`
	// DropAAAA adds a firewall rule on the node's forward path that drops
	// AAAA queries for the lab's names.
	DropAAAA bool `json:"drop_aaaa"`
	// BackendPort is the port the backends listen on and the VIP's port 53
	// is DNATed to (0: 53). OpenShift's cluster DNS listens on 5353.
	BackendPort uint16 `json:"backend_port,omitempty"`
	// LocalNAT puts the DNAT (and SNAT) rules in each pod's own namespace,
	// on the OUTPUT and POSTROUTING hooks of its local sockets, as
	// kube-proxy's rules act for a host-network pod or a node agent; the
	// node then only routes. SNAT then rewrites to the pod's own address.
	LocalNAT bool `json:"local_nat,omitempty"`
	// ResolvOptions go on the pods' resolv.conf "options" line.
	ResolvOptions []string `json:"resolv_options,omitempty"`
	// Cache puts a dnsmasq cache between the pods and the VIP: CachePod
	// (a pod of its own on the bridge) or CacheNode (in the node's own
	// namespace); "" has the pods ask the VIP (cache.go).
	Cache string `json:"cache,omitempty"`
	// CacheQueryPort, when set, is the one source port of every upstream
	// query of the cache (dnsmasq --query-port).
	CacheQueryPort uint16 `json:"cache_query_port,omitempty"`
	// BackendPods makes each backend a pod of its own on the node's
	// bridge (backends.go), so one can be replaced mid-run.
	BackendPods bool `json:"backend_pods,omitempty"`
	// SharedNames, when set, has every pod ask the same SharedNames names
	// in turn (a cache then joins their questions), instead of a name of
	// its own.
	SharedNames int `json:"shared_names,omitempty"`
}

func (t Topology) NodeNS() string     { return t.Prefix + "-node" }
func (t Topology) DNSNS() string      { return t.Prefix + "-dns" }
func (t Topology) PodNS(i int) string { return fmt.Sprintf("%s-pod%d", t.Prefix, i) }
func (t Topology) statePath() string  { return filepath.Join(StateDir, t.Prefix+".json") }

// Port returns the port the backends listen on.
func (t Topology) Port() uint16 {
	if t.BackendPort == 0 {
		return 53
	}
	return t.BackendPort
}

// NATNamespaces returns the namespaces whose conntrack the lab's NAT rules
// drive: the node, or every pod when the NAT is local.
func (t Topology) NATNamespaces() []string {
	if t.LocalNAT {
		return t.podNames()
	}
	return []string{t.NodeNS()}
}
func (t Topology) namespaces() []string {
	ns := append([]string{t.NodeNS(), t.DNSNS()}, t.podNames()...)
	if t.Cache == CachePod {
		ns = append(ns, t.CacheNS())
	}
	return ns
}

func (t Topology) podNames() []string {
	names := make([]string, t.Pods)
	for i := range names {
		names[i] = t.PodNS(i)
	}
	return names
}

// Validate rejects a topology that cannot be built.
func (t Topology) Validate() error {
	switch {
	case t.Prefix == "" || len(t.Prefix) > 20 || strings.ContainsAny(t.Prefix, "/ ."):
		return fmt.Errorf("prefix %q: want 1-20 characters without '/', '.' or spaces", t.Prefix)
	case t.Pods < 1 || t.Pods > MaxPods:
		return fmt.Errorf("pods %d: want 1 to %d", t.Pods, MaxPods)
	case t.Backends < 1 || t.Backends > MaxBackends:
		return fmt.Errorf("backends %d: want 1 to %d", t.Backends, MaxBackends)
	case t.SNAT && (t.SNATPorts.Min == 0 || t.SNATPorts.Min > t.SNATPorts.Max):
		return fmt.Errorf("SNAT port range %s is empty or reversed", t.SNATPorts)
	case t.UDPTimeout < 0:
		return fmt.Errorf("udp timeout %d: want >= 0", t.UDPTimeout)
	case t.Cache != "" && t.Cache != CachePod && t.Cache != CacheNode:
		return fmt.Errorf("cache %q: want %q or %q", t.Cache, CachePod, CacheNode)
	case t.Cache != "" && t.LocalNAT:
		return errors.New("a cache and NAT in the pods' own namespaces do not go together: the cache asks the VIP, not the pods")
	case t.SharedNames < 0:
		return fmt.Errorf("shared names %d: want >= 0", t.SharedNames)
	}
	return nil
}

// StateDir holds one state file per standing lab. The file is created
// exclusively first thing, so it doubles as the lab's lock.
const StateDir = "/run/dnsrace"

// State is what a standing lab records about itself.
type State struct {
	Topology Topology  `json:"topology"`
	Created  time.Time `json:"created"`
	// ServerPID is the detached process serving DNS for `lab up`.
	ServerPID int          `json:"server_pid,omitempty"`
	Scenario  string       `json:"scenario,omitempty"`
	Server    ServerConfig `json:"server"`
}

// ErrLabUp is returned when a lab with the same prefix is standing.
var ErrLabUp = errors.New("a lab is already up")

// ReadState returns the state of the standing lab with prefix.
func ReadState(prefix string) (State, error) {
	var st State
	b, err := os.ReadFile(Topology{Prefix: prefix}.statePath())
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}

func writeState(path string, st State, exclusive bool) error {
	if err := os.MkdirAll(StateDir, 0o755); err != nil {
		return err
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if exclusive {
		flags |= os.O_EXCL
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%w (state %s): run 'dnsrace lab down' first", ErrLabUp, path)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return json.NewEncoder(f).Encode(st)
}

// build creates every namespace, link, address, route, sysctl and rule of
// t. It stops at the first error; the caller tears down.
func build(t Topology, fail string) error {
	steps := []struct {
		name string
		fn   func() error
	}{
		{"namespaces", func() error { return createNamespaces(t) }},
		{"links", func() error { return buildLinks(t) }},
		{"sysctls", func() error { return setSysctls(t) }},
		{"backends and cache", func() error { return buildExtras(t) }},
		{"rules", func() error { return installRules(t) }},
		{"resolv.conf", func() error { return writePodEtc(t) }},
	}
	for _, s := range steps {
		if fail == s.name {
			return fmt.Errorf("building lab: step %s: injected failure", s.name)
		}
		if err := s.fn(); err != nil {
			return fmt.Errorf("building lab: step %s: %w", s.name, err)
		}
	}
	return nil
}

func createNamespaces(t Topology) error {
	for _, n := range t.namespaces() {
		if err := nsutil.Create(n); err != nil {
			return err
		}
	}
	return nil
}

// handle returns a netlink handle bound to the named namespace.
func handle(name string) (*netlink.Handle, netns.NsHandle, error) {
	ns, err := netns.GetFromPath(nsutil.Path(name))
	if err != nil {
		return nil, 0, fmt.Errorf("opening %s: %w", name, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, 0, fmt.Errorf("netlink in %s: %w", name, err)
	}
	return h, ns, nil
}

// onBridge runs fn with a netlink handle in the node's namespace and its
// bridge, where pods are plugged in.
func onBridge(t Topology, fn func(node *netlink.Handle, br netlink.Link) error) error {
	node, nodeNS, err := handle(t.NodeNS())
	if err != nil {
		return err
	}
	defer node.Close()
	defer nodeNS.Close()
	br, err := node.LinkByName("br0")
	if err != nil {
		return fmt.Errorf("finding the node's bridge: %w", err)
	}
	return fn(node, br)
}

func addrOf(p netip.Prefix, flags int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}, Flags: flags}
}

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Masked().Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func buildLinks(t Topology) error {
	node, nodeNS, err := handle(t.NodeNS())
	if err != nil {
		return err
	}
	defer node.Close()
	defer nodeNS.Close()
	dns, dnsNS, err := handle(t.DNSNS())
	if err != nil {
		return err
	}
	defer dns.Close()
	defer dnsNS.Close()

	for _, h := range []*netlink.Handle{node, dns} {
		if err := linkUp(h, "lo"); err != nil {
			return err
		}
	}
	// Its MAC is set, as the CNI bridge plugin sets cni0's: a bridge
	// left to itself takes its ports' lowest, and when that port goes (a
	// backend pod deleted) every pod's frames to the gateway's old MAC
	// are flooded and dropped (OTHERHOST) until their neighbour entries
	// are resolved again, a stall that is no scenario's.
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0", HardwareAddr: gatewayMAC(PodGateway.Addr())}}
	if err := node.LinkAdd(br); err != nil {
		return fmt.Errorf("adding bridge: %w", err)
	}
	if err := node.AddrAdd(br, addrOf(PodGateway, 0)); err != nil {
		return fmt.Errorf("addressing bridge: %w", err)
	}
	if err := node.AddrAdd(br, addrOf(netip.MustParsePrefix("fd00:244::1/64"), nodad)); err != nil {
		return fmt.Errorf("addressing bridge: %w", err)
	}
	if err := node.LinkSetUp(br); err != nil {
		return err
	}

	// Uplink: node "to-dns" <-> dns "eth0".
	up := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "to-dns"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(dnsNS)}
	if err := node.LinkAdd(up); err != nil {
		return fmt.Errorf("adding uplink veth: %w", err)
	}
	if err := node.AddrAdd(up, addrOf(NodeUplink, 0)); err != nil {
		return err
	}
	if err := node.LinkSetUp(up); err != nil {
		return err
	}
	deth, err := dns.LinkByName("eth0")
	if err != nil {
		return err
	}
	for i := 0; i < t.Backends; i++ {
		if err := dns.AddrAdd(deth, addrOf(netip.PrefixFrom(BackendAddr(i), 24), 0)); err != nil {
			return fmt.Errorf("addressing backend %d: %w", i, err)
		}
	}
	if err := dns.LinkSetUp(deth); err != nil {
		return err
	}
	// Replies to unNATed pod sources go back through the node.
	if err := dns.RouteAdd(&netlink.Route{LinkIndex: deth.Attrs().Index, Dst: ipnet(podNet), Gw: NodeUplink.Addr().AsSlice()}); err != nil {
		return fmt.Errorf("routing pods from dns: %w", err)
	}
	if t.Cache == CacheNode {
		// A process of the node routes before its OUTPUT DNAT: the VIP
		// needs a route, as a node's default route gives it.
		if err := node.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Dst: ipnet(netip.PrefixFrom(VIP, 32))}); err != nil {
			return fmt.Errorf("routing the VIP from the node: %w", err)
		}
	}

	for i := 0; i < t.Pods; i++ {
		if err := buildPod(t, i, node, br); err != nil {
			return fmt.Errorf("pod %d: %w", i, err)
		}
	}
	return nil
}

// nodad keeps IPv6 addresses usable at once (no duplicate detection wait).
const nodad = 0x02 // IFA_F_NODAD

func buildPod(t Topology, i int, node *netlink.Handle, br netlink.Link) error {
	pod, podNS, err := handle(t.PodNS(i))
	if err != nil {
		return err
	}
	defer pod.Close()
	defer podNS.Close()
	v := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: podLink(i), MasterIndex: br.Attrs().Index},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(podNS),
	}
	if err := node.LinkAdd(v); err != nil {
		return fmt.Errorf("adding veth: %w", err)
	}
	if err := node.LinkSetUp(v); err != nil {
		return err
	}
	if err := linkUp(pod, "lo"); err != nil {
		return err
	}
	eth, err := pod.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := pod.AddrAdd(eth, addrOf(netip.PrefixFrom(PodAddr(i), 24), 0)); err != nil {
		return err
	}
	if err := pod.AddrAdd(eth, addrOf(netip.PrefixFrom(PodAddr6(i), 64), nodad)); err != nil {
		return err
	}
	if err := pod.LinkSetUp(eth); err != nil {
		return err
	}
	return pod.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: PodGateway.Addr().AsSlice()})
}

func linkUp(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return err
	}
	return h.LinkSetUp(l)
}

// writeSysctl writes a per-namespace sysctl from inside the namespace.
func writeSysctl(ns, key, value string) error {
	return nsutil.Do(ns, func() error {
		p := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
		if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
			return fmt.Errorf("setting %s=%s in %s: %w", key, value, ns, err)
		}
		return nil
	})
}

func setSysctls(t Topology) error {
	if err := writeSysctl(t.NodeNS(), "net.ipv4.ip_forward", "1"); err != nil {
		return err
	}
	if t.Cache == CachePod || t.BackendPods {
		// The node forwards between pods of its own bridge (the cache's
		// query to a backend pod): an ICMP redirect would send the pod
		// straight to the backend, past the DNAT.
		for _, dev := range []string{"all", "br0"} {
			if err := writeSysctl(t.NodeNS(), "net.ipv4.conf."+dev+".send_redirects", "0"); err != nil {
				return err
			}
		}
	}
	if t.UDPTimeout > 0 {
		// The conntrack sysctls exist once the rules below load conntrack
		// in these namespaces; installRules sets them again after that.
		for _, ns := range t.NATNamespaces() {
			_ = writeSysctl(ns, "net.netfilter.nf_conntrack_udp_timeout", strconv.Itoa(t.UDPTimeout))
		}
	}
	return nil
}

// writePodEtc writes each pod's resolv.conf and nsswitch.conf under
// /etc/netns/POD/, where both `ip netns exec` and nsutil.Command find them.
func writePodEtc(t Topology) error {
	for _, n := range t.podNames() {
		if err := writeOnePodEtc(t, n); err != nil {
			return err
		}
	}
	return nil
}

func writeOnePodEtc(t Topology, pod string) error {
	resolv := fmt.Sprintf("# written by dnsrace lab\nnameserver %s\n", t.Nameserver())
	if len(t.ResolvOptions) > 0 {
		resolv += "options " + strings.Join(t.ResolvOptions, " ") + "\n"
	}
	dir := filepath.Join(nsutil.EtcDir, pod)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(resolv), 0o644); err != nil {
		return err
	}
	// Only DNS: a host's nsswitch may route names to systemd-resolved
	// or mDNS, which would bypass the lab.
	return os.WriteFile(filepath.Join(dir, "nsswitch.conf"), []byte("hosts: dns\n"), 0o644)
}

// Teardown removes everything a lab with prefix may have made: processes
// inside its namespaces, the namespaces (and with them every link, rule and
// conntrack entry), /etc/netns folders and the state file. It works from
// the names alone, so it also cleans up after a crashed run.
func Teardown(prefix string) error {
	var errs []error
	if st, err := ReadState(prefix); err == nil && st.ServerPID > 0 {
		_ = syscall.Kill(st.ServerPID, syscall.SIGKILL)
	}
	all, err := nsutil.List(prefix + "-")
	if err != nil {
		errs = append(errs, err)
	}
	var names []string
	for _, n := range all {
		if ownedBy(prefix, n) {
			names = append(names, n)
		}
	}
	killProcessesIn(names)
	for _, n := range names {
		if err := nsutil.Delete(n); err != nil {
			errs = append(errs, err)
		}
	}
	// /etc/netns folders of namespaces that never got mounted.
	if ents, err := os.ReadDir(nsutil.EtcDir); err == nil {
		for _, e := range ents {
			if ownedBy(prefix, e.Name()) {
				_ = os.RemoveAll(filepath.Join(nsutil.EtcDir, e.Name()))
			}
		}
	}
	if err := os.Remove(Topology{Prefix: prefix}.statePath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ownedBy reports whether a namespace name is one a lab with prefix makes:
// PREFIX-node, PREFIX-dns or PREFIX-podN. A plain prefix match would let
// `lab down` (prefix "dnsrace") tear down a lab named "dnsrace-x".
func ownedBy(prefix, name string) bool {
	rest, ok := strings.CutPrefix(name, prefix+"-")
	if !ok {
		return false
	}
	if rest == "node" || rest == "dns" || rest == "cache" {
		return true
	}
	if n, ok := strings.CutPrefix(rest, "be"); ok && n != "" {
		_, err := strconv.ParseUint(n, 10, 8)
		return err == nil && (n == "0" || n[0] != '0')
	}
	n, ok := strings.CutPrefix(rest, "pod")
	if !ok || n == "" {
		return false
	}
	_, err := strconv.ParseUint(n, 10, 16)
	return err == nil && (n == "0" || n[0] != '0')
}

// killProcessesIn sends SIGKILL to every process whose network namespace is
// one of names, and waits briefly for them to go, so namespace deletion
// really frees the namespace.
func killProcessesIn(names []string) {
	inodes := map[uint64]bool{}
	for _, n := range names {
		var st syscall.Stat_t
		if syscall.Stat(nsutil.Path(n), &st) == nil {
			inodes[st.Ino] = true
		}
	}
	if len(inodes) == 0 {
		return
	}
	self := os.Getpid()
	for round := 0; round < 20; round++ {
		found := false
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == self {
				continue
			}
			var st syscall.Stat_t
			if syscall.Stat(filepath.Join("/proc", e.Name(), "ns/net"), &st) != nil || !inodes[st.Ino] {
				continue
			}
			found = true
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if !found {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// gatewayMAC is the bridge's MAC for gateway address a, in the CNI
// plugins' convention: 0a:58 and the address (locally administered,
// unicast).
func gatewayMAC(a netip.Addr) net.HardwareAddr {
	b := a.As4()
	return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
}
