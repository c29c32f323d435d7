package nsutil

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/dnsrace/dnsrace/internal/testutil"
)

func TestNsfsMount(t *testing.T) {
	for _, c := range []struct {
		line string
		ino  uint32
		at   string
		ok   bool
	}{
		{"46 45 0:4 net:[4026532174] /run/netns/zz rw shared:2 - nsfs nsfs rw", 4026532174, "/run/netns/zz", true},
		{"46 45 0:4 net:[4026532174] /run/netns/a\\040b rw - nsfs nsfs rw", 4026532174, "/run/netns/a b", true},
		// No optional fields at all.
		{"46 45 0:4 net:[7] /x rw - nsfs nsfs rw", 7, "/x", true},
		// Another namespace type, another file system, a cut line.
		{"46 45 0:4 mnt:[4026531841] /run/m rw - nsfs nsfs rw", 0, "", false},
		{"22 1 0:21 / /proc rw,nosuid - proc proc rw", 0, "", false},
		{"46 45 0:4 net:[4026532174] /run/netns/zz rw shared:2 -", 0, "", false},
		{"46 45 0:4 net:[nope] /run/netns/zz rw - nsfs nsfs rw", 0, "", false},
	} {
		ino, at, ok := nsfsMount([]byte(c.line))
		if ino != c.ino || at != c.at || ok != c.ok {
			t.Errorf("%q: got %d %q %v, want %d %q %v", c.line, ino, at, ok, c.ino, c.at, c.ok)
		}
	}
}

// TestLiving: a namespace is alive while a name or a process holds it, and
// not when only an open file does.
func TestLiving(t *testing.T) {
	testutil.RequireRoot(t)
	name := "dnsrace-t-living"
	_ = Delete(name)
	if err := Create(name); err != nil {
		t.Fatal(err)
	}
	defer Delete(name)
	ino, err := Inode(name)
	if err != nil {
		t.Fatal(err)
	}
	self, _ := PathInode("/proc/self/ns/net")
	alive := Living("/proc")
	if _, ok := alive[self]; !ok {
		t.Errorf("the test's own namespace %d is not alive", self)
	}
	p, ok := alive[ino]
	if !ok {
		t.Fatalf("named namespace %d not found", ino)
	}
	if got, _ := PathInode(p); got != ino {
		t.Errorf("path %s opens namespace %d, not %d", p, got, ino)
	}

	// A process in it, and the name gone: alive by the process.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := Command(ctx, name, "sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	// The helper re-execs into the namespace: wait until it is there.
	procNS := "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/net"
	for deadline := time.Now().Add(10 * time.Second); ; {
		if got, _ := PathInode(procNS); got == ino {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the process never entered the namespace")
		}
		time.Sleep(10 * time.Millisecond)
	}
	held, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := Delete(name); err != nil {
		t.Fatal(err)
	}
	if p, ok := Living("/proc")[ino]; !ok {
		t.Error("a namespace a process is in is not alive")
	} else if got, _ := PathInode(p); got != ino {
		t.Errorf("path %s opens namespace %d, not %d", p, got, ino)
	}

	// Only an open file left: gone, as far as anyone but its holder knows.
	cmd.Process.Kill()
	cmd.Wait()
	cmd.Process.Release()
	if _, ok := Living("/proc")[ino]; ok {
		t.Error("a namespace only an open file holds is alive")
	}
}
