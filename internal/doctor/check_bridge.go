package doctor

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"
)

// linkInfo is what sysfs says about one interface.
type linkInfo struct {
	Name      string
	Master    string
	IsBridge  bool
	Physical  bool // has a device link (a NIC), or a NIC-like name in fixtures
	OperState string
}

// readLinks lists /sys/class/net under the root.
func (e *env) readLinks() (map[string]*linkInfo, error) {
	ents, err := os.ReadDir(e.hostPath("/sys/class/net"))
	if err != nil {
		return nil, fmt.Errorf("listing /sys/class/net: %w", unwrapPathErr(err))
	}
	links := map[string]*linkInfo{}
	for _, ent := range ents {
		n := ent.Name()
		base := "/sys/class/net/" + n
		li := &linkInfo{Name: n}
		if m, err := e.sysfsLink(base + "/master"); err == nil {
			li.Master = m
		}
		li.IsBridge = e.isDir(base + "/bridge")
		_, derr := os.Lstat(e.hostPath(base + "/device"))
		li.Physical = derr == nil || nicName(n)
		if s, err := e.sysfsString(base + "/operstate"); err == nil {
			li.OperState = s
		}
		links[n] = li
	}
	return links, nil
}

func nicName(n string) bool {
	for _, p := range []string{"eth", "en", "ib", "wl"} {
		if strings.HasPrefix(n, p) {
			return true
		}
	}
	return false
}

func vethName(n string) bool {
	for _, p := range []string{"azv", "veth", "cali", "lxc", "vnet", "cni"} {
		if strings.HasPrefix(n, p) {
			return true
		}
	}
	return false
}

// defaultRouteIface returns the interface of the IPv4 default route with
// the lowest metric, from /proc/net/route.
func (e *env) defaultRouteIface() (string, error) {
	data, _, err := e.read("/proc/net/route")
	if err != nil {
		return "", err
	}
	return parseDefaultRoute(data)
}

// parseDefaultRoute reads /proc/net/route text: the interface of the
// IPv4 default route (destination and mask 0) with the lowest metric, ""
// when there is none.
func parseDefaultRoute(data []byte) (string, error) {
	best, bestMetric := "", -1
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	first := true
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if first {
			first = false
			if len(f) < 8 || f[0] != "Iface" {
				return "", fmt.Errorf("parsing /proc/net/route: unexpected header %q", sc.Text())
			}
			continue
		}
		if len(f) < 8 {
			continue
		}
		if f[1] != "00000000" || f[7] != "00000000" {
			continue
		}
		var metric int
		fmt.Sscanf(f[6], "%d", &metric)
		if bestMetric < 0 || metric < bestMetric {
			best, bestMetric = f[0], metric
		}
	}
	if first {
		return "", fmt.Errorf("parsing /proc/net/route: empty file")
	}
	return best, nil
}

// cniConfig is the part of a CNI network config doctor reads.
type cniConfig struct {
	Path   string
	Name   string
	Type   string // of the main plugin
	Mode   string
	Bridge string
}

// readCNI reads the CNI config the runtime uses: the first file by name in
// /etc/cni/net.d with a .conf, .conflist or .json suffix.
func (e *env) readCNI() (*cniConfig, error) {
	dir := "/etc/cni/net.d"
	ents, err := os.ReadDir(e.hostPath(dir))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", dir, unwrapPathErr(err))
	}
	var names []string
	for _, ent := range ents {
		switch path.Ext(ent.Name()) {
		case ".conf", ".conflist", ".json":
			names = append(names, ent.Name())
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return nil, nil
	}
	p := path.Join(dir, names[0])
	data, _, err := e.read(p)
	if err != nil {
		return nil, err
	}
	return parseCNI(p, data)
}

// parseCNI reads a CNI network config (.conf: one plugin; .conflist: a
// "plugins" list) found at node path p: the main plugin's type, mode and
// bridge.
func parseCNI(p string, data []byte) (*cniConfig, error) {
	type plugin struct {
		Type   string `json:"type"`
		Mode   string `json:"mode"`
		Bridge string `json:"bridge"`
	}
	var raw struct {
		Name string `json:"name"`
		plugin
		Plugins []plugin `json:"plugins"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", p, err)
	}
	c := &cniConfig{Path: p, Name: raw.Name, Type: raw.Type, Mode: raw.Mode, Bridge: raw.Bridge}
	if raw.Type == "" && len(raw.Plugins) == 0 {
		return nil, fmt.Errorf("parsing %s: neither \"type\" nor \"plugins\"", p)
	}
	for _, pl := range raw.Plugins {
		if c.Type == "" || pl.Type == "azure-vnet" || pl.Type == "bridge" {
			c.Type, c.Mode, c.Bridge = pl.Type, pl.Mode, pl.Bridge
		}
		if pl.Type == "azure-vnet" {
			break
		}
	}
	if c.Type == "azure-vnet" && c.Bridge == "" && c.Mode == "bridge" {
		c.Bridge = "azure0"
	}
	return c, nil
}

func dhcpOn(v string) bool {
	switch strings.ToLower(v) {
	case "yes", "true", "1", "on", "ipv4", "both":
		return true
	}
	return false
}

// checkBridge: has the CNI moved the uplink (eth0) into a bridge while
// systemd-networkd still manages it and would manage the bridge and the
// pod veths too? On Flatcar with Azure CNI in bridge mode that loses the
// DHCP-learned DNS servers (seed 000).
func checkBridge(_ context.Context, e *env) Result {
	var probs problems
	var r Result
	links, err := e.readLinks()
	if err != nil {
		return Result{Verdict: Skip, Reason: err.Error()}
	}
	cni, cerr := e.readCNI()
	if cerr != nil {
		probs.addf("%v", cerr)
	} else if cni != nil {
		ev := fmt.Sprintf("%s: type=%s", cni.Path, cni.Type)
		if cni.Mode != "" {
			ev += " mode=" + cni.Mode
		}
		if cni.Bridge != "" {
			ev += " bridge=" + cni.Bridge
		}
		r.Evidence = append(r.Evidence, ev)
	}

	defIf, rerr := e.defaultRouteIface()
	if rerr != nil {
		probs.addf("%v", rerr)
	} else if defIf == "" {
		r.Evidence = append(r.Evidence, "/proc/net/route: no IPv4 default route")
	} else {
		r.Evidence = append(r.Evidence, "/proc/net/route: default route via "+defIf)
	}

	// Find the uplink and the bridge it was moved into.
	var uplink, bridge string
	if li := links[defIf]; li != nil {
		switch {
		case li.IsBridge:
			bridge = li.Name
			for _, n := range sortedKeys(links) {
				if p := links[n]; p.Master == bridge && p.Physical && !vethName(n) {
					uplink = n
					break
				}
			}
		case li.Master != "" && links[li.Master] != nil && links[li.Master].IsBridge:
			uplink, bridge = li.Name, li.Master
		default:
			uplink = li.Name
		}
	} else {
		// No usable default route: look for any NIC enslaved to a bridge.
		for _, n := range sortedKeys(links) {
			p := links[n]
			if p.Physical && !vethName(n) && p.Master != "" && links[p.Master] != nil && links[p.Master].IsBridge {
				uplink, bridge = n, p.Master
				break
			}
		}
	}
	var ports []string
	if bridge != "" {
		for _, n := range sortedKeys(links) {
			if links[n].Master == bridge {
				ports = append(ports, n)
			}
		}
		r.Evidence = append(r.Evidence,
			fmt.Sprintf("/sys/class/net/%s/bridge: %s is a bridge, ports: %s", bridge, bridge, strings.Join(ports, " ")))
	}
	if uplink != "" && bridge != "" {
		r.Evidence = append(r.Evidence, fmt.Sprintf("/sys/class/net/%s/master -> %s (operstate %s, %s %s)",
			uplink, bridge, orUnknown(links[uplink].OperState), bridge, orUnknown(links[bridge].OperState)))
	}

	files := e.loadNetworkd(&probs)
	if e.isDir("/run/systemd/netif/links") {
		r.Evidence = append(r.Evidence, "/run/systemd/netif/links exists: systemd-networkd is running")
	}
	managedBy := func(ifname string) (*networkFile, bool) {
		nf := networkFor(files, ifname)
		return nf, nf != nil && !nf.Unmanaged
	}
	// The links networkd must keep its hands off: the bridge and the pod
	// veths (azv* for Azure CNI; the real ports when there are any).
	guard := []string{}
	bridgeName := bridge
	if bridgeName == "" && cni != nil && cni.Mode == "bridge" {
		bridgeName = cni.Bridge
	}
	if bridgeName != "" {
		guard = append(guard, bridgeName)
	}
	vethSeen := false
	for _, p := range ports {
		if vethName(p) {
			guard = append(guard, p)
			vethSeen = true
		}
	}
	if !vethSeen && cni != nil && cni.Type == "azure-vnet" {
		guard = append(guard, "azv0") // stands for azv*: no pod veth exists yet
	}
	var grabbed []string
	for _, g := range guard {
		nf, managed := managedBy(g)
		label := g
		if g == "azv0" {
			label = "azv*"
		}
		switch {
		case nf == nil:
			r.Evidence = append(r.Evidence, label+": no .network file matches (networkd leaves it alone)")
		case managed:
			grabbed = append(grabbed, label)
			r.Evidence = append(r.Evidence, fmt.Sprintf("%s: managed by %s", label, nf.describe()))
		default:
			r.Evidence = append(r.Evidence, fmt.Sprintf("%s: unmanaged by %s", label, nf.describe()))
		}
	}

	fix := "keep systemd-networkd off the CNI's links: add /etc/systemd/network/10-cni-unmanaged.network with " +
		"\"[Match] Name=" + strings.Join(append(nonEmpty(bridgeName), "azv*"), " ") + "\" and \"[Link] Unmanaged=true\" " +
		"(then `networkctl reload`), or run Azure CNI in transparent mode (\"mode\": \"transparent\" in the conflist); " +
		"pin DNS= in /etc/systemd/resolved.conf so the servers do not depend on the uplink's DHCP lease"

	switch {
	case uplink != "" && bridge != "":
		nf, managed := managedBy(uplink)
		dhcp := managed && dhcpOn(nf.DHCP)
		if nf != nil {
			r.Evidence = append(r.Evidence, fmt.Sprintf("%s: %s by %s", uplink, map[bool]string{true: "managed", false: "unmanaged"}[managed], nf.describe()))
		} else {
			r.Evidence = append(r.Evidence, uplink+": no .network file matches")
		}
		switch {
		case managed && len(grabbed) > 0:
			r.Verdict, r.Fix = Fail, fix
			r.Summary = fmt.Sprintf("%s is enslaved to bridge %s while systemd-networkd manages it and %s (no Unmanaged=true drop-in)",
				uplink, bridge, strings.Join(grabbed, ", "))
		case dhcp:
			r.Verdict, r.Fix = Warn, fix
			r.Summary = fmt.Sprintf("%s is enslaved to bridge %s but networkd still runs DHCP on it: DHCP-learned DNS servers can be dropped", uplink, bridge)
		default:
			r.Verdict = OK
			r.Summary = fmt.Sprintf("%s is a port of bridge %s, but systemd-networkd does not manage it", uplink, bridge)
		}
	case cni != nil && cni.Mode == "bridge" && len(grabbed) > 0:
		r.Verdict, r.Fix = Warn, fix
		r.Summary = fmt.Sprintf("CNI is in bridge mode (%s) and systemd-networkd would manage %s: the uplink will be taken over when the first pod starts",
			bridgeName, strings.Join(grabbed, ", "))
	case uplink != "":
		r.Verdict = OK
		r.Summary = fmt.Sprintf("uplink %s holds the default route and is not a bridge port", uplink)
	default:
		r.Verdict = OK
		r.Summary = "no uplink enslaved to a bridge"
		if rerr != nil {
			probs.addf("no default route interface known")
		}
	}
	return probs.finish(r)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
