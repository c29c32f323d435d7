package lab

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/testutil"
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
