package podtest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Pod is one fake pod.
type Pod struct {
	Namespace, Name, UID, Container, ContainerID string
	// Cgroup is the container's cgroup directory.
	Cgroup string
}

// Node holds the fake pods of one test.
type Node struct {
	CgroupRoot string // the cgroup v2 mount
	Root       string // holds var/log/pods and var/log/containers
	made       []string
	pids       []int
}

// NewNode prepares a node over cgroupRoot with its log tree in root.
func NewNode(cgroupRoot, root string) (*Node, error) {
	for _, d := range []string{"var/log/pods", "var/log/containers"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return nil, fmt.Errorf("creating the log tree: %w", err)
		}
	}
	return &Node{CgroupRoot: cgroupRoot, Root: root}, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// NewUID returns a random pod UID (8-4-4-4-12 hex).
func NewUID() string {
	h := randHex(16)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// AddPod creates the pod's cgroup and log entries and moves pid into the
// container's cgroup.
func (n *Node) AddPod(namespace, name, container string, pid int) (*Pod, error) {
	p := &Pod{Namespace: namespace, Name: name, UID: NewUID(), Container: container, ContainerID: randHex(32)}
	dirs := []string{
		"kubepods.slice",
		"kubepods.slice/kubepods-besteffort.slice",
		"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + strings.ReplaceAll(p.UID, "-", "_") + ".slice",
	}
	dirs = append(dirs, dirs[2]+"/cri-containerd-"+p.ContainerID+".scope")
	for _, d := range dirs {
		full := filepath.Join(n.CgroupRoot, d)
		if err := os.Mkdir(full, 0o755); err == nil {
			n.made = append(n.made, full)
		} else if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("creating cgroup %s: %w", full, err)
		}
	}
	p.Cgroup = filepath.Join(n.CgroupRoot, dirs[3])
	if err := os.WriteFile(filepath.Join(p.Cgroup, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return nil, fmt.Errorf("moving pid %d into %s: %w", pid, p.Cgroup, err)
	}
	n.pids = append(n.pids, pid)
	podDir := filepath.Join(n.Root, "var/log/pods", namespace+"_"+name+"_"+p.UID, container)
	if err := os.MkdirAll(podDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", podDir, err)
	}
	logFile := filepath.Join(podDir, "0.log")
	if err := os.WriteFile(logFile, nil, 0o644); err != nil {
		return nil, fmt.Errorf("writing %s: %w", logFile, err)
	}
	link := filepath.Join(n.Root, "var/log/containers", name+"_"+namespace+"_"+container+"-"+p.ContainerID+".log")
	if err := os.Symlink(logFile, link); err != nil {
		return nil, fmt.Errorf("linking %s: %w", link, err)
	}
	return p, nil
}

// Close moves the pods' processes still alive back to the root cgroup and
// removes the cgroup directories it created, deepest first.
func (n *Node) Close() error {
	var errs []error
	for _, pid := range n.pids {
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err != nil {
			continue
		}
		_ = os.WriteFile(filepath.Join(n.CgroupRoot, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
	}
	for i := len(n.made) - 1; i >= 0; i-- {
		if err := os.Remove(n.made[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", n.made[i], err))
		}
	}
	n.made = nil
	return errors.Join(errs...)
}
