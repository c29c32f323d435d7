package nsutil

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/testutil"
)

func TestMain(m *testing.M) {
	MaybeExecHelper()
	os.Exit(m.Run())
}

func TestNamespaceLifecycle(t *testing.T) {
	testutil.RequireRoot(t)
	name := "dnsrace-t-nsutil"
	_ = Delete(name)
	if err := Create(name); err != nil {
		t.Fatal(err)
	}
	defer Delete(name)
	if err := Create(name); err == nil {
		t.Error("a second Create with the same name succeeded")
	}
	ino, err := Inode(name)
	if err != nil || ino == 0 {
		t.Fatalf("inode %d, %v", ino, err)
	}
	var st unix.Stat_t
	_ = unix.Stat("/proc/self/ns/net", &st)
	if uint32(st.Ino) == ino {
		t.Fatal("the new namespace is the test's own")
	}
	// Do runs on a thread inside it: only loopback exists there.
	var links []string
	if err := Do(name, func() error {
		ents, err := os.ReadDir("/proc/thread-self/net/dev_snmp6")
		for _, e := range ents {
			links = append(links, e.Name())
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(links, ",") != "lo" {
		t.Errorf("links inside: %v, want only lo", links)
	}
	// DoPath enters the same namespace by its path.
	var inside uint32
	if err := DoPath(Path(name), func() error {
		var s unix.Stat_t
		err := unix.Stat("/proc/thread-self/ns/net", &s)
		inside = uint32(s.Ino)
		return err
	}); err != nil || inside != ino {
		t.Errorf("DoPath ran in namespace %d (%v), want %d", inside, err, ino)
	}
	// The calling thread stayed where it was.
	_ = unix.Stat("/proc/thread-self/ns/net", &st)
	if uint32(st.Ino) == ino {
		t.Error("the caller's thread was left in the namespace")
	}
	// Command sees /etc/netns/NAME files over /etc, like ip netns exec.
	dir := filepath.Join(EtcDir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte("nameserver 192.0.2.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := Command(context.Background(), name, "sh", "-c", "cat /etc/resolv.conf; readlink /proc/self/ns/net").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(string(out), "nameserver 192.0.2.1") || !strings.Contains(string(out), "net:["+itoa(ino)+"]") {
		t.Errorf("command output %q", out)
	}
	if err := Delete(name); err != nil {
		t.Fatal(err)
	}
	if Exists(name) {
		t.Error("still exists after Delete")
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("/etc/netns folder left behind")
	}
}

func itoa(n uint32) string {
	b := []byte{}
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
