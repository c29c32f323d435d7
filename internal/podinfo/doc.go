// Package podinfo names the Kubernetes pod and container behind a network
// namespace, a process or a cgroup, from what a node already has and without
// the API server:
//
//   - a process's cgroup (PROC/<pid>/cgroup, the cgroup v2 "0::" line, or a
//     v1 hierarchy's line) holds the pod UID and the container ID in the
//     kubelet's names: the systemd driver's
//     kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid
//     with underscores>.slice/cri-containerd-<id>.scope (crio-<id>.scope,
//     docker-<id>.scope), or the cgroupfs driver's
//     /kubepods/burstable/pod<uid>/<id>;
//   - a cgroup id (what bpf_get_current_cgroup_id returns) is the inode of
//     the cgroup v2 directory: the directories under the cgroup v2 mount are
//     stat'ed to find its path;
//   - a network namespace inode leads to the processes in it (PROC/<pid>/
//     ns/net); the first with a pod cgroup names the pod. Every pod has a
//     long-lived sandbox (pause) process, so this works for queries from
//     short-lived processes too;
//   - the pod UID leads to namespace and name through the kubelet's log
//     folders ROOT/var/log/pods/<namespace>_<name>_<uid>/, and the container
//     ID to the container name through the symlinks
//     ROOT/var/log/containers/<pod>_<namespace>_<container>-<id>.log.
//
// A namespace that is the host's (PROC/1/ns/net; the resolver's own when
// PROC is /proc and pid 1 cannot be read, as in some sandboxes) and has no
// pod is reported as Host. Answers are cached for TTL (a namespace
// that names no pod too); the cgroup tree and the log folders are reread at
// most once per TTL, and one walk of PROC maps every namespace to its
// processes (redone after TTL, or after a second when a namespace is not in
// it), each pid re-checked to still be in the namespace before use. Everything works under prefixes (Config.ProcRoot /host/proc,
// Config.Root /host) for a kubectl debug pod. What cannot be resolved is
// left empty, never guessed: a pod whose log folder is gone has its UID but
// no name, and a query resolved only through its namespace has the pod but
// not necessarily the container (the container is set only when the
// resolving process's own cgroup names one that has a log symlink).
package podinfo
