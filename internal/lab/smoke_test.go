package lab

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/testutil"
	"github.com/vishvananda/netlink"
)

func TestMain(m *testing.M) {
	nsutil.MaybeExecHelper()
	os.Exit(m.Run())
}

func TestSmokeGetent(t *testing.T) {
	testutil.RequireRoot(t)
	topo := Topology{Prefix: testPrefix, Pods: 1, Backends: 2}
	l, err := Up(topo, ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Down()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := nsutil.Command(ctx, topo.PodNS(0), "getent", "ahosts", QName(0)).CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatal(err)
	}
}

// TestBridgeKeepsItsMAC: a backend pod replaced (its veth removed from the
// bridge) leaves the gateway's MAC as it was, whatever the MACs of the
// ports: a bridge whose MAC is its ports' lowest changes it when that port
// goes, and every pod's frames to the gateway are flooded and dropped
// until the pods resolve it again.
func TestBridgeKeepsItsMAC(t *testing.T) {
	testutil.RequireRoot(t)
	topo := Topology{Prefix: testPrefix, Pods: 1, Backends: 1, BackendPods: true}
	l, err := Up(topo, ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Down()
	node, nodeNS, err := handle(topo.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	defer nodeNS.Close()
	defer node.Close()
	// The backend's port the lowest MAC there is: the bridge would take it.
	be, err := node.LinkByName(backendLink(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := node.LinkSetHardwareAddr(be, net.HardwareAddr{0x02, 0, 0, 0, 0, 1}); err != nil {
		t.Fatal(err)
	}
	before := bridgeMAC(t, node)
	if err := l.ReplaceBackend(0, 1); err != nil {
		t.Fatal(err)
	}
	if after := bridgeMAC(t, node); after.String() != before.String() || before.String() != gatewayMAC(PodGateway.Addr()).String() {
		t.Errorf("the bridge's MAC was %s, is %s after its backend port went; want %s throughout", before, after, gatewayMAC(PodGateway.Addr()))
	}
}

func bridgeMAC(t *testing.T, h *netlink.Handle) net.HardwareAddr {
	t.Helper()
	br, err := h.LinkByName("br0")
	if err != nil {
		t.Fatal(err)
	}
	return br.Attrs().HardwareAddr
}
