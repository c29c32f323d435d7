// Package podtest makes a process look like a Kubernetes pod's to podinfo,
// on the real kernel: it creates a cgroup v2 directory named the way the
// kubelet's systemd driver names it
// (kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope),
// moves the process in, and writes the kubelet's /var/log/pods and
// /var/log/containers entries under a temporary root. Close moves the
// processes back to the root cgroup and removes the directories it created.
// For tests only; it needs root and a cgroup v2 mount.
package podtest
