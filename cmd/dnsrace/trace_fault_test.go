package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/testutil"
)

// failAfter accepts n bytes, then fails every write.
type failAfter struct {
	n   int
	got bytes.Buffer
}

func (f *failAfter) Write(p []byte) (int, error) {
	if f.got.Len()+len(p) > f.n {
		k := f.n - f.got.Len()
		f.got.Write(p[:k])
		return k, &os.PathError{Op: "write", Path: "/x/out", Err: syscall.ENOSPC}
	}
	return f.got.Write(p)
}

// TestOutputWriter: the first error is reported once, on one line, without
// repeating the path; later writes fail at once and write nothing.
func TestOutputWriter(t *testing.T) {
	var report bytes.Buffer
	dst := &failAfter{n: 10}
	o := &outputWriter{w: dst, name: "/x/out", report: &report}
	if _, err := o.Write([]byte("12345\n")); err != nil || o.Err() != nil {
		t.Fatalf("first write: %v, Err %v", err, o.Err())
	}
	if n, err := o.Write([]byte("6789abcdef\n")); err == nil || n != 4 {
		t.Fatalf("write past the limit: %d, %v", n, err)
	}
	if _, err := o.Write([]byte("more\n")); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write after the error: %v", err)
	}
	if dst.got.String() != "12345\n6789" {
		t.Errorf("written %q", dst.got.String())
	}
	want := "dnsrace trace: writing /x/out: no space left on device (nothing more is written there; the summary goes to stderr)\n"
	if report.String() != want {
		t.Errorf("report %q, want %q", report.String(), want)
	}
	if !errors.Is(o.Err(), syscall.ENOSPC) {
		t.Errorf("Err() = %v", o.Err())
	}
}

// TestTraceOutputFileFull runs the tracer with --output-file on a full
// filesystem (a 64 KiB tmpfs filled to the last byte): one error line on
// stderr, the summary on stderr instead, exit status 1.
func TestTraceOutputFileFull(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=64k,mode=0755"); err != nil {
		t.Fatalf("mounting a tmpfs: %v", err)
	}
	defer func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	}()
	fill, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	block := make([]byte, 4096)
	for {
		if _, err := fill.Write(block); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling the tmpfs: %v", err)
			}
			break
		}
	}
	// Down to the last byte of the last page.
	for i := 0; ; i++ {
		if _, err := fill.Write([]byte{0}); err != nil {
			break
		}
		if i == len(block) {
			t.Fatal("the full tmpfs keeps taking bytes")
		}
	}
	fill.Close()

	for _, asJSON := range []bool{false, true} {
		t.Run(fmt.Sprintf("json=%v", asJSON), func(t *testing.T) {
			outFile := filepath.Join(dir, fmt.Sprintf("out-%v", asJSON))
			args := []string{"trace", "--output-file", outFile, "--duration", "2s", "--progress", "never"}
			if asJSON {
				args = append(args, "--json")
			}
			r := runBin(t, 60*time.Second, args...)
			if r.code != 1 {
				t.Errorf("exit status %d, want 1; stderr:\n%s", r.code, r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
			var errLines []string
			for _, l := range strings.Split(r.stderr, "\n") {
				if strings.Contains(l, "no space left on device") {
					errLines = append(errLines, l)
				}
			}
			want := "dnsrace trace: writing " + outFile + ": no space left on device"
			if len(errLines) != 1 || !strings.HasPrefix(errLines[0], want) {
				t.Errorf("error lines %q, want one starting %q", errLines, want)
			}
			if asJSON {
				var sum map[string]any
				for _, l := range strings.Split(r.stderr, "\n") {
					if strings.HasPrefix(l, "{") && json.Unmarshal([]byte(l), &sum) == nil && sum["type"] == "summary" {
						break
					}
					sum = nil
				}
				if sum == nil || sum["kernel"] == nil {
					t.Errorf("no JSON summary on stderr:\n%s", r.stderr)
				}
			} else if !strings.Contains(r.stderr, "summary after") || !strings.Contains(r.stderr, "insert_failed") {
				t.Errorf("no summary on stderr:\n%s", r.stderr)
			}
			if b, _ := os.ReadFile(outFile); len(b) != 0 {
				t.Errorf("%s holds %q on a full filesystem", outFile, b)
			}
		})
	}
}

// dnsraceProgPrefixes are the name prefixes of dnsrace's BPF programs
// (tp_ tracepoint, kp_/krp_ kprobe/kretprobe, fe_/fx_ fentry/fexit).
var dnsraceProgPrefixes = []string{"tp_", "kp_", "krp_", "fe_", "fx_"}

// bpfObjects reads the BPF program, link and map ids that pid holds
// through its file descriptors (/proc/PID/fdinfo: a link's fdinfo names
// its program too).
func bpfObjects(t *testing.T, pid int) (progs, links, maps map[uint32]bool) {
	t.Helper()
	progs, links, maps = map[uint32]bool{}, map[uint32]bool{}, map[uint32]bool{}
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("listing %s: %v", dir, err)
	}
	for _, e := range ents {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			id, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			if err != nil {
				continue
			}
			switch k {
			case "prog_id":
				progs[uint32(id)] = true
			case "link_id":
				links[uint32(id)] = true
			case "map_id":
				maps[uint32(id)] = true
			}
		}
		f.Close()
	}
	return progs, links, maps
}

// bpftoolIDs lists the ids `bpftool OBJ show` prints.
func bpftoolIDs(t *testing.T, obj string) map[uint32]string {
	t.Helper()
	out, err := exec.Command("bpftool", "--json", obj, "show").Output()
	if err != nil {
		t.Fatalf("bpftool %s show: %v", obj, err)
	}
	var list []struct {
		ID     uint32 `json:"id"`
		Name   string `json:"name"`
		ProgID uint32 `json:"prog_id"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		t.Fatalf("bpftool %s show: %v: %s", obj, err, out)
	}
	ids := map[uint32]string{}
	for _, x := range list {
		ids[x.ID] = x.Name
	}
	return ids
}

// TestTraceSIGKILLLeavesNoBPF kills the tracer with SIGKILL once every
// probe is attached: no program, link or map it held may remain, by id,
// neither through cilium/ebpf nor in bpftool's listings. Nothing of
// dnsrace's is pinned, so the kernel frees everything with the last file
// descriptor; this test proves it.
func TestTraceSIGKILLLeavesNoBPF(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("bpftool"); err != nil {
		testutil.SkipOrFail(t, "bpftool is not installed (scripts/install-deps installs it)")
	}
	ready := filepath.Join(t.TempDir(), "ready")
	var stderr bytes.Buffer
	tr := exec.Command(dnsraceBin, "trace", "--json", "--progress", "never", "--ready-file", ready)
	tr.Stderr = &stderr
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, tr, ready, &stderr)
	progs, links, maps := bpfObjects(t, tr.Process.Pid)
	shownProgs, shownLinks := bpftoolIDs(t, "prog"), bpftoolIDs(t, "link")
	ours := 0
	for id := range progs {
		name, shown := shownProgs[id]
		if !shown {
			t.Errorf("program %d held by the tracer is not in bpftool prog show", id)
		}
		for _, p := range dnsraceProgPrefixes {
			if strings.HasPrefix(name, p) {
				ours++
			}
		}
	}
	for id := range links {
		if _, shown := shownLinks[id]; !shown {
			t.Errorf("link %d held by the tracer is not in bpftool link show", id)
		}
	}
	t.Logf("the tracer holds %d programs (%d named like dnsrace's), %d links, %d maps", len(progs), ours, len(links), len(maps))
	// Each kind must be there, or its check below loops over nothing.
	if ours == 0 || len(links) == 0 || len(maps) == 0 {
		tr.Process.Kill()
		tr.Wait()
		t.Fatalf("found none of dnsrace's programs, links or maps in /proc/%d/fdinfo: %v %v %v", tr.Process.Pid, progs, links, maps)
	}

	if err := tr.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := tr.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("tracer ended with %v, want killed by SIGKILL", err)
	}

	// The kernel may free the last objects from a work queue: allow it a
	// moment, then every id must be gone.
	gone := func() []string {
		var left []string
		for id := range progs {
			if p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id)); err == nil {
				info, _ := p.Info()
				left = append(left, fmt.Sprintf("program %d %s", id, info.Name))
				p.Close()
			} else if !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("looking up program %d: %v", id, err)
			}
		}
		for id := range links {
			if l, err := link.NewFromID(link.ID(id)); err == nil {
				left = append(left, fmt.Sprintf("link %d", id))
				l.Close()
			} else if !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("looking up link %d: %v", id, err)
			}
		}
		for id := range maps {
			if m, err := ebpf.NewMapFromID(ebpf.MapID(id)); err == nil {
				left = append(left, fmt.Sprintf("map %d", id))
				m.Close()
			} else if !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("looking up map %d: %v", id, err)
			}
		}
		return left
	}
	var left []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if left = gone(); len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("left after SIGKILL: %v", left)
	}
	afterProgs, afterLinks := bpftoolIDs(t, "prog"), bpftoolIDs(t, "link")
	for id := range progs {
		if name, ok := afterProgs[id]; ok {
			t.Errorf("bpftool prog show still lists program %d %s", id, name)
		}
	}
	for id := range links {
		if _, ok := afterLinks[id]; ok {
			t.Errorf("bpftool link show still lists link %d", id)
		}
	}
}

// TestTraceMetricsAddrInUse: --metrics-addr on a port something already
// listens on fails at start, before any probe is loaded, with one line and
// exit status 2.
func TestTraceMetricsAddrInUse(t *testing.T) {
	testutil.RequireRoot(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	r := runBin(t, 60*time.Second, "trace", "--metrics-addr", ln.Addr().String(), "--duration", "30s")
	if r.code != 2 || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 ||
		!strings.Contains(r.stderr, ln.Addr().String()) || !strings.Contains(r.stderr, "address already in use") {
		t.Errorf("exit %d, stderr %q; want 2 and one line naming %s in use", r.code, r.stderr, ln.Addr())
	}
	if r.stdout != "" || strings.Contains(r.stderr, "tracing DNS") {
		t.Errorf("stdout %q, stderr %q: it traced instead of failing at start", r.stdout, r.stderr)
	}
}
