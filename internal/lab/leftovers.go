package lab

import (
	"os"
	"strings"

	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// Leftovers lists what a lab with prefix still has on the machine of what
// Teardown removes by name: namespaces, /etc/netns folders and its state
// file. Empty once a lab is down.
func Leftovers(prefix string) []string {
	var left []string
	names, _ := nsutil.List(prefix + "-")
	for _, n := range names {
		left = append(left, "netns "+n)
	}
	if ents, err := os.ReadDir(nsutil.EtcDir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), prefix+"-") {
				left = append(left, "/etc/netns/"+e.Name())
			}
		}
	}
	if _, err := os.Stat(Topology{Prefix: prefix}.statePath()); err == nil {
		left = append(left, "state file")
	}
	return left
}
