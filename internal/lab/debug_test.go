package lab

import (
	"os"
	"os/exec"
	"testing"
)

func TestDebugUp(t *testing.T) {
	if os.Getenv("LABDEBUG") == "" {
		t.Skip()
	}
	topo := Topology{Prefix: "dnsrace-t", Pods: 1, Backends: 2}
	l, err := Up(topo, ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Down()
	out, _ := exec.Command("bash", "-c", os.Getenv("LABDEBUG")).CombinedOutput()
	t.Logf("%s", out)
}
