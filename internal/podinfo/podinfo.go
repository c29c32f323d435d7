package podinfo

import (
	"bufio"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// Pod is what is known of the sender of a query.
type Pod struct {
	Namespace   string `json:"namespace,omitempty"`
	Name        string `json:"name,omitempty"`
	UID         string `json:"uid,omitempty"`
	Container   string `json:"container,omitempty"`
	ContainerID string `json:"container_id,omitempty"`
	// Host: the host's network namespace, and no pod cgroup found.
	Host bool `json:"host,omitempty"`
	// PID and Comm of the process that resolved it (host: the sender).
	PID  uint32 `json:"pid,omitempty"`
	Comm string `json:"comm,omitempty"`
}

// Config says where the node's files are.
type Config struct {
	// ProcRoot is the host's /proc (default /proc).
	ProcRoot string
	// Root prefixes /var/log/pods and /var/log/containers (default "").
	Root string
	// CgroupRoot is the cgroup v2 mount (default: ROOT/sys/fs/cgroup when
	// it is cgroup2, else ROOT/sys/fs/cgroup/unified).
	CgroupRoot string
	// TTL of cached answers and of rescans (default 10 s).
	TTL time.Duration
}

// Resolver answers lookups; it is safe for concurrent use.
type Resolver struct {
	cfg Config

	mu        sync.Mutex
	byNetNS   map[uint32]cached
	byPID     map[uint32]cached
	byCgroup  map[uint64]cached
	cgPaths   map[uint64]string // cgroup id -> path relative to CgroupRoot
	cgScanned time.Time
	nsPids    map[uint32][]uint32 // netns -> processes in it
	nsScanned time.Time
	swept     time.Time            // when the caches last dropped stale answers
	pods      map[string][2]string // uid -> namespace, name
	ctrs      map[string]string    // container id -> container name
	logsRead  time.Time
	hostNetNS uint32
	now       func() time.Time
}

type cached struct {
	pod Pod
	ok  bool
	at  time.Time
}

// New returns a resolver over cfg.
func New(cfg Config) *Resolver {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.TTL == 0 {
		cfg.TTL = 10 * time.Second
	}
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = findCgroup2(cfg.Root)
	}
	r := &Resolver{cfg: cfg, byNetNS: map[uint32]cached{}, byPID: map[uint32]cached{},
		byCgroup: map[uint64]cached{}, cgPaths: map[uint64]string{}, now: time.Now}
	var ok bool
	if r.hostNetNS, ok = nsutil.PathInode(filepath.Join(cfg.ProcRoot, "1/ns/net")); !ok && cfg.ProcRoot == "/proc" {
		// PID 1 is not ours to read (a sandbox): take our own namespace
		// as the host's.
		r.hostNetNS, _ = nsutil.PathInode("/proc/self/ns/net")
	}
	return r
}

// findCgroup2 returns where cgroup v2 is mounted under root: the unified
// hierarchy itself, or the hybrid layout's /sys/fs/cgroup/unified.
func findCgroup2(root string) string {
	for _, p := range []string{"sys/fs/cgroup", "sys/fs/cgroup/unified"} {
		dir := filepath.Join("/", root, p)
		var st unix.Statfs_t
		if unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return dir
		}
	}
	return filepath.Join("/", root, "sys/fs/cgroup")
}

// CgroupRoot is the cgroup v2 directory the resolver reads.
func (r *Resolver) CgroupRoot() string { return r.cfg.CgroupRoot }

// Lookup names the pod behind a query: by its cgroup id, then its pid,
// then its network namespace (any may be zero).
func (r *Resolver) Lookup(netns, pid uint32, cgroup uint64) (Pod, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// One clock read for the three caches: a flood of incidents from
	// outside any pod asks all three for every incident.
	now := r.now()
	r.sweep(now)
	if cgroup != 0 {
		if p, ok := r.cgroupLocked(cgroup, now); ok {
			return p, true
		}
	}
	if pid != 0 {
		if p, ok := r.pidLocked(pid, netns, now); ok {
			return p, true
		}
	}
	if netns != 0 {
		return r.netnsLocked(netns, now)
	}
	return Pod{}, false
}

// ByNetNS names the pod that owns a network namespace.
func (r *Resolver) ByNetNS(netns uint32) (Pod, bool) { return r.Lookup(netns, 0, 0) }

// ByPID names the pod of a process.
func (r *Resolver) ByPID(pid uint32) (Pod, bool) { return r.Lookup(0, pid, 0) }

// ByCgroup names the pod of a cgroup v2 id.
func (r *Resolver) ByCgroup(id uint64) (Pod, bool) { return r.Lookup(0, 0, id) }

// sweepAfter is, in TTLs, how often the caches drop their stale answers:
// pods, processes and cgroups that come and go on a node must leave
// nothing behind in a tracer that runs for weeks.
const sweepAfter = 6

// sweep drops the answers older than TTL, every sweepAfter TTLs; under
// r.mu.
func (r *Resolver) sweep(now time.Time) {
	if now.Sub(r.swept) < sweepAfter*r.cfg.TTL {
		return
	}
	r.swept = now
	dropStale(r.byNetNS, now, r.cfg.TTL)
	dropStale(r.byPID, now, r.cfg.TTL)
	dropStale(r.byCgroup, now, r.cfg.TTL)
}

func dropStale[K comparable](m map[K]cached, now time.Time, ttl time.Duration) {
	for k, c := range m {
		if now.Sub(c.at) >= ttl {
			delete(m, k)
		}
	}
}

func (r *Resolver) fresh(c cached, ok bool, now time.Time) bool {
	return ok && now.Sub(c.at) < r.cfg.TTL
}

func (r *Resolver) cgroupLocked(id uint64, now time.Time) (Pod, bool) {
	if c, ok := r.byCgroup[id]; r.fresh(c, ok, now) {
		return c.pod, c.ok
	}
	path, ok := r.cgPaths[id]
	if !ok && now.Sub(r.cgScanned) >= r.cfg.TTL {
		r.scanCgroups()
		path, ok = r.cgPaths[id]
	}
	var p Pod
	if ok {
		p, ok = r.fromCgroupPath(path)
	}
	r.byCgroup[id] = cached{p, ok, now}
	return p, ok
}

func (r *Resolver) pidLocked(pid, netns uint32, now time.Time) (Pod, bool) {
	if c, ok := r.byPID[pid]; r.fresh(c, ok, now) {
		return c.pod, c.ok
	}
	p, ok, gone := r.fromPID(pid)
	if !ok && netns != 0 && netns == r.hostNetNS {
		p, ok = Pod{Host: true, PID: pid, Comm: r.comm(pid)}, true
	}
	// A process that is gone answers nothing: do not cache that. One that
	// is in no pod is cached like a pod's: a burst of incidents from it (a
	// flood of lost queries) must not read its cgroup file once each.
	if ok || !gone {
		r.byPID[pid] = cached{p, ok, now}
	}
	return p, ok
}

func (r *Resolver) netnsLocked(netns uint32, now time.Time) (Pod, bool) {
	if c, ok := r.byNetNS[netns]; r.fresh(c, ok, now) {
		return c.pod, c.ok
	}
	var p Pod
	ok := false
	for _, pid := range r.pidsIn(netns) {
		// The walk may be a few seconds old: the pid must still be in
		// netns (not gone, nor reused by another pod's process).
		if ino, in := nsutil.PathInode(filepath.Join(r.cfg.ProcRoot, strconv.FormatUint(uint64(pid), 10), "ns/net")); !in || ino != netns {
			continue
		}
		if p, ok, _ = r.fromPID(pid); ok {
			break
		}
	}
	if !ok && netns == r.hostNetNS && r.hostNetNS != 0 {
		p, ok = Pod{Host: true}, true
	}
	r.byNetNS[netns] = cached{p, ok, now}
	return p, ok
}

// pidsIn lists the processes whose network namespace is netns. One walk
// of PROC maps every namespace to its processes; it is redone when older
// than TTL, or when netns is missing from it and it is older than a second
// (a pod born since), so a burst of incidents costs one walk.
func (r *Resolver) pidsIn(netns uint32) []uint32 {
	age := r.now().Sub(r.nsScanned)
	if pids, ok := r.nsPids[netns]; ok && age < r.cfg.TTL {
		return pids
	}
	if r.nsPids != nil && age < time.Second {
		return r.nsPids[netns]
	}
	r.nsScanned = r.now()
	r.nsPids = map[uint32][]uint32{}
	ents, err := os.ReadDir(r.cfg.ProcRoot)
	if err != nil {
		return nil
	}
	for _, e := range ents {
		n, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		if ino, ok := nsutil.PathInode(filepath.Join(r.cfg.ProcRoot, e.Name(), "ns/net")); ok {
			r.nsPids[ino] = append(r.nsPids[ino], uint32(n))
		}
	}
	return r.nsPids[netns]
}

func (r *Resolver) comm(pid uint32) string {
	b, err := os.ReadFile(filepath.Join(r.cfg.ProcRoot, strconv.FormatUint(uint64(pid), 10), "comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// fromPID reads a process's cgroup file and parses the kubelet's names;
// gone: the file could not be opened (the process exited).
func (r *Resolver) fromPID(pid uint32) (p Pod, ok, gone bool) {
	f, err := os.Open(filepath.Join(r.cfg.ProcRoot, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if err != nil {
		return Pod{}, false, true
	}
	defer f.Close()
	for _, path := range CgroupPaths(f) {
		if p, ok := r.fromCgroupPath(path); ok {
			p.PID, p.Comm = pid, r.comm(pid)
			return p, true, false
		}
	}
	return Pod{}, false, false
}

// CgroupPaths returns the paths of a /proc/<pid>/cgroup file, one per
// hierarchy line "hierarchy-ID:controllers:path" (cgroup v2: "0::path"), in
// file order. Any hierarchy names the pod the same way. Lines of another
// shape are skipped.
func CgroupPaths(r io.Reader) []string {
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) == 3 {
			out = append(out, parts[2])
		}
	}
	return out
}

var (
	// kubepods-burstable-pod0a1b_2c3d.slice (systemd) or pod0a1b-2c3d
	// (cgroupfs).
	podRE = regexp.MustCompile(`(?:^|/)(?:kubepods(?:-[a-z]+)*-)?pod([0-9a-fA-F][0-9a-fA-F_-]{7,})(?:\.slice)?(?:/|$)`)
	// cri-containerd-<id>.scope, crio-<id>.scope, docker-<id>.scope, or
	// a bare <id> (cgroupfs).
	ctrRE = regexp.MustCompile(`^(?:(?:cri-containerd|crio|docker|containerd)-)?([0-9a-f]{64})(?:\.scope)?$`)
)

// ParseCgroupPath extracts the pod UID and container ID from a cgroup path
// in any of the kubelet's layouts; ok is false when it names no pod.
func ParseCgroupPath(path string) (uid, containerID string, ok bool) {
	if !strings.Contains(path, "kubepods") {
		return "", "", false
	}
	m := podRE.FindStringSubmatch(path)
	if m == nil {
		return "", "", false
	}
	uid = strings.ReplaceAll(m[1], "_", "-")
	if c := ctrRE.FindStringSubmatch(filepath.Base(path)); c != nil {
		containerID = c[1]
	}
	return uid, containerID, true
}

func (r *Resolver) fromCgroupPath(path string) (Pod, bool) {
	uid, cid, ok := ParseCgroupPath(path)
	if !ok {
		return Pod{}, false
	}
	p := Pod{UID: uid, ContainerID: cid}
	r.name(&p)
	return p, true
}

// name fills namespace, name and container from the kubelet's log
// folders, reread at most once per TTL when something is missing.
func (r *Resolver) name(p *Pod) {
	fill := func() bool {
		nn, ok := r.pods[p.UID]
		if ok {
			p.Namespace, p.Name = nn[0], nn[1]
		}
		if p.ContainerID != "" {
			p.Container = r.ctrs[p.ContainerID]
		}
		return ok && (p.ContainerID == "" || p.Container != "")
	}
	if fill() || (r.pods != nil && r.now().Sub(r.logsRead) < r.cfg.TTL) {
		return
	}
	r.readLogs()
	fill()
}

func (r *Resolver) readLogs() {
	r.logsRead = r.now()
	r.pods, r.ctrs = map[string][2]string{}, map[string]string{}
	base := filepath.Join("/", r.cfg.Root, "var/log")
	if ents, err := os.ReadDir(filepath.Join(base, "pods")); err == nil {
		for _, e := range ents {
			if ns, name, uid, ok := ParsePodLogDir(e.Name()); ok {
				r.pods[uid] = [2]string{ns, name}
			}
		}
	}
	if ents, err := os.ReadDir(filepath.Join(base, "containers")); err == nil {
		for _, e := range ents {
			if _, _, ctr, id, ok := ParseContainerLog(e.Name()); ok {
				r.ctrs[id] = ctr
			}
		}
	}
}

// ParsePodLogDir splits the name of a kubelet pod log folder,
// <namespace>_<name>_<uid>. Namespaces, pod names and UIDs cannot hold '_',
// so the split is unambiguous; ok is false for any other name.
func ParsePodLogDir(dir string) (namespace, name, uid string, ok bool) {
	f := strings.Split(dir, "_")
	if len(f) != 3 || f[0] == "" || f[1] == "" || f[2] == "" {
		return "", "", "", false
	}
	return f[0], f[1], f[2], true
}

// ParseContainerLog splits the name of a kubelet container log symlink,
// <pod>_<namespace>_<container>-<64-character id>.log (the suffix is
// optional).
func ParseContainerLog(file string) (pod, namespace, container, id string, ok bool) {
	n := strings.TrimSuffix(file, ".log")
	if len(n) < 66 || n[len(n)-65] != '-' {
		return "", "", "", "", false
	}
	id = n[len(n)-64:]
	f := strings.Split(n[:len(n)-65], "_")
	if len(f) != 3 || f[0] == "" || f[1] == "" || f[2] == "" {
		return "", "", "", "", false
	}
	return f[0], f[1], f[2], id, true
}

// scanCgroups maps every cgroup v2 directory's inode (its cgroup id) to
// its path below the kubepods hierarchy.
func (r *Resolver) scanCgroups() {
	r.cgScanned = r.now()
	clear(r.cgPaths) // a deleted pod's cgroups must not stay
	root := r.cfg.CgroupRoot
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		rel := strings.TrimPrefix(p, root)
		// Only the pod hierarchy matters: skip the rest of the tree.
		if rel != "" && !strings.Contains(rel, "kubepods") {
			return fs.SkipDir
		}
		var st syscall.Stat_t
		if syscall.Stat(p, &st) == nil {
			r.cgPaths[st.Ino] = rel
		}
		return nil
	})
}
