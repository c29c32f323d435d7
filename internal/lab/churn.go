package lab

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/vishvananda/netlink"

	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// Pods come and go on a real node. AddPod and DeletePod do to a standing
// lab what a CNI plugin and the container runtime do when a pod starts and
// when it is deleted, so a tracer can be watched through pod churn.

// AddPod adds pod i to a standing lab, as a CNI plugin wires a new pod: its
// namespace, a veth on the node's bridge, its addresses and route, its
// counters, its NAT rules where the lab's NAT is local, and its
// resolv.conf. Pod i must not exist.
func (l *Lab) AddPod(i int) error {
	t := l.Topology
	if i < 0 || i >= MaxPods {
		return fmt.Errorf("adding pod %d: the lab has room for pods 0 to %d", i, MaxPods-1)
	}
	name := t.PodNS(i)
	if err := nsutil.Create(name); err != nil {
		return fmt.Errorf("adding pod %d: %w", i, err)
	}
	if err := l.wirePod(i); err != nil {
		_ = nsutil.Delete(name)
		return fmt.Errorf("adding pod %d: %w", i, err)
	}
	if i >= l.Topology.Pods {
		l.Topology.Pods = i + 1
	}
	return nil
}

func (l *Lab) wirePod(i int) error {
	t := l.Topology
	if err := onBridge(t, func(node *netlink.Handle, br netlink.Link) error { return buildPod(t, i, node, br) }); err != nil {
		return err
	}
	if err := installPodCounters(t.PodNS(i)); err != nil {
		return err
	}
	if t.LocalNAT {
		if err := installPodNAT(t, i); err != nil {
			return err
		}
		if t.UDPTimeout > 0 {
			if err := writeSysctl(t.PodNS(i), "net.netfilter.nf_conntrack_udp_timeout", strconv.Itoa(t.UDPTimeout)); err != nil {
				return err
			}
		}
	}
	return writeOnePodEtc(t, t.PodNS(i))
}

// DeletePod deletes pod i as `ip netns del` does once the pod's processes
// are killed: its name goes, and its links go with the namespace when the
// kernel frees it, which is once nothing else holds it.
func (l *Lab) DeletePod(i int) error {
	name := l.Topology.PodNS(i)
	killProcessesIn([]string{name})
	return nsutil.Delete(name)
}

// UnplugPod removes pod i's veth, as a CNI plugin's DEL does before the
// runtime lets the namespace go: the pod is off the bridge at once,
// whatever holds its namespace.
func (l *Lab) UnplugPod(i int) error {
	if err := unplug(l.Topology.NodeNS(), podLink(i)); err != nil {
		return fmt.Errorf("unplugging pod %d: %w", i, err)
	}
	return nil
}

// unplug deletes the node's end of a pod's veth (the pod's end goes with it).
func unplug(nodeNS, link string) error {
	node, h, err := handle(nodeNS)
	if err != nil {
		return err
	}
	defer node.Close()
	defer h.Close()
	v, err := node.LinkByName(link)
	if err != nil {
		return err
	}
	return node.LinkDel(v)
}

// podLink is pod i's veth on the node's bridge.
func podLink(i int) string { return fmt.Sprintf("pod%d", i) }

// PodLinkExists reports whether pod i's veth is still on the node: it is
// until the pod is unplugged or its namespace is freed.
func (l *Lab) PodLinkExists(i int) (bool, error) {
	node, nodeNS, err := handle(l.Topology.NodeNS())
	if err != nil {
		return false, err
	}
	defer node.Close()
	defer nodeNS.Close()
	_, err = node.LinkByName(podLink(i))
	if err == nil {
		return true, nil
	}
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return false, nil
	}
	return false, err
}
