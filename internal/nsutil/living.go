package nsutil

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Living maps the inode of every network namespace something outside
// dnsrace holds to a path that opens it: a process in it (PROC/PID/ns/net),
// or a name, an nsfs bind mount in any process's mount namespace
// (iproute2's /run/netns/NAME, a container runtime's /var/run/netns/cni-…),
// opened through that process's root (PROC/PID/root/MOUNTPOINT). procRoot
// is the host's /proc (/host/proc in kubectl debug).
//
// A namespace missing from the map is one only open files or sockets hold:
// a tracer that holds it too is what keeps it alive, and must let go.
// Threads that entered a namespace on their own (setns) are not looked at.
func Living(procRoot string) map[uint32]string {
	out := map[uint32]string{}
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return out
	}
	mounts := map[uint64]bool{} // mount namespaces read
	var st unix.Stat_t
	// A name in this process's own mount namespace opens as it is
	// (/run/netns/NAME), and is kept over any other path: a name outlives
	// the processes in it.
	var own uint64
	if unix.Stat("/proc/self/ns/mnt", &st) == nil {
		own = st.Ino
	}
	names := map[uint32]bool{}
	for _, e := range ents {
		if _, err := strconv.ParseUint(e.Name(), 10, 32); err != nil {
			continue
		}
		dir := filepath.Join(procRoot, e.Name())
		p := filepath.Join(dir, "ns", "net")
		if unix.Stat(p, &st) == nil {
			if _, ok := out[uint32(st.Ino)]; !ok {
				out[uint32(st.Ino)] = p
			}
		}
		if unix.Stat(filepath.Join(dir, "ns", "mnt"), &st) != nil || mounts[st.Ino] {
			continue
		}
		mounts[st.Ino] = true
		root := filepath.Join(dir, "root")
		if st.Ino == own {
			root = "/"
		}
		namedIn(dir, root, out, names)
	}
	return out
}

// namedIn adds the network namespaces mounted in the mount namespace of the
// process at dir (PROC/PID), opened through root (its root, or "/" for our
// own mount namespace); names replace the processes' paths in out, and the
// first name of each is kept (in names).
func namedIn(dir, root string, out map[uint32]string, names map[uint32]bool) {
	f, err := os.Open(filepath.Join(dir, "mountinfo"))
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		ino, at, ok := nsfsMount(sc.Bytes())
		if !ok {
			continue
		}
		if !names[ino] {
			out[ino], names[ino] = filepath.Join(root, at), true
		}
	}
}

// nsfsMount parses one mountinfo line (proc(5)): "ID PARENT MAJ:MIN ROOT
// MOUNTPOINT OPTIONS [TAGS...] - FSTYPE SOURCE SUPEROPTS". A network
// namespace's bind mount has FSTYPE nsfs and ROOT net:[INODE].
func nsfsMount(line []byte) (ino uint32, mountPoint string, ok bool) {
	fields := bytes.Fields(line)
	if len(fields) < 7 {
		return 0, "", false
	}
	sep := -1
	for i := 6; i < len(fields); i++ {
		if string(fields[i]) == "-" {
			sep = i
			break
		}
	}
	if sep < 0 || sep+1 >= len(fields) || string(fields[sep+1]) != "nsfs" {
		return 0, "", false
	}
	root, found := bytes.CutPrefix(fields[3], []byte("net:["))
	if !found || len(root) < 2 || root[len(root)-1] != ']' {
		return 0, "", false
	}
	n, err := strconv.ParseUint(string(root[:len(root)-1]), 10, 32)
	if err != nil {
		return 0, "", false
	}
	return uint32(n), unescapeMount(fields[4]), true
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, \011,
// \012, \134).
func unescapeMount(b []byte) string {
	if bytes.IndexByte(b, '\\') < 0 {
		return string(b)
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] == '\\' && i+4 <= len(b) {
			if v, err := strconv.ParseUint(string(b[i+1:i+4]), 8, 8); err == nil {
				out = append(out, byte(v))
				i += 3
				continue
			}
		}
		out = append(out, b[i])
	}
	return string(out)
}
