package ctentry

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

func TestStatusString(t *testing.T) {
	if s := (SeenReply | Assured | DstNAT | 1<<12).String(); s != "SEEN_REPLY|ASSURED|DST_NAT" {
		t.Errorf("%q", s)
	}
	if s := Status(0).String(); s != "none" {
		t.Errorf("%q", s)
	}
}

func run(t *testing.T, stdin string, argv ...string) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
}

// A scratch namespace where a local socket's queries to a VIP are DNATed
// on output to a backend behind a veth whose peer answers nothing (the
// packets leave and are lost; the entry is made and confirmed all the
// same).
func TestGetDumpDelete(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("nft"); err != nil {
		testutil.SkipOrFail(t, "nft not installed (make deps)")
	}
	name := fmt.Sprintf("dnsrace-t-ct-%d", os.Getpid())
	_ = nsutil.Delete(name)
	if err := nsutil.Create(name); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := nsutil.Delete(name); err != nil {
			t.Errorf("deleting netns: %v", err)
		}
	}()
	path := nsutil.Path(name)
	for _, argv := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "d0", "type", "veth", "peer", "name", "d1"},
		{"addr", "add", "10.251.0.1/24", "dev", "d0"},
		{"link", "set", "d0", "up"},
		{"link", "set", "d1", "up"},
		{"neigh", "add", "10.251.0.2", "lladdr", "02:00:00:00:00:02", "dev", "d0"},
		{"route", "add", "10.96.0.0/16", "via", "10.251.0.2"},
		{"route", "add", "10.244.0.0/16", "via", "10.251.0.2"},
	} {
		run(t, "", append([]string{"ip", "-n", name}, argv...)...)
	}
	run(t, `table ip t {
	chain out {
		type nat hook output priority -100; policy accept;
		ip daddr 10.96.0.10 udp dport 53 dnat to 10.244.1.5:5353
	}
}
`, "ip", "netns", "exec", name, "nft", "-f", "-")
	// The timestamp extension must be on before the entry is made.
	if err := nsutil.DoPath(path, func() error {
		return os.WriteFile("/proc/sys/net/netfilter/nf_conntrack_timestamp", []byte("1\n"), 0o644)
	}); err != nil {
		t.Fatalf("turning conntrack timestamps on: %v", err)
	}
	var conn *net.UDPConn
	if err := nsutil.DoPath(path, func() (err error) {
		conn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 251, 0, 1), Port: 40053})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	before := time.Now()
	// A sendto on a local socket runs the output and postrouting hooks
	// in the call: the entry is confirmed when it returns.
	if _, err := conn.WriteToUDP([]byte("query"), &net.UDPAddr{IP: net.IPv4(10, 96, 0, 10), Port: 53}); err != nil {
		t.Fatal(err)
	}
	orig := Tuple{Src: netip.MustParseAddrPort("10.251.0.1:40053"), Dst: netip.MustParseAddrPort("10.96.0.10:53"), Proto: unix.IPPROTO_UDP}
	e, err := Get(path, orig)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	t.Logf("%+v", e)
	if e.Orig != orig {
		t.Errorf("orig %v, want %v", e.Orig, orig)
	}
	wantReply := Tuple{Src: netip.MustParseAddrPort("10.244.1.5:5353"), Dst: netip.MustParseAddrPort("10.251.0.1:40053"), Proto: unix.IPPROTO_UDP}
	if e.Reply != wantReply || e.DNATTarget() != wantReply.Src {
		t.Errorf("reply %v, want %v", e.Reply, wantReply)
	}
	if e.Status&(DstNAT|Confirmed) != DstNAT|Confirmed || e.Status&SeenReply != 0 {
		t.Errorf("status %s, want DST_NAT and CONFIRMED, no SEEN_REPLY", e.Status)
	}
	if e.Timeout <= 0 {
		t.Errorf("timeout %v", e.Timeout)
	}
	// The kernel stamps the entry with its own wall clock, in ns.
	if e.Start.IsZero() || e.Start.Before(before.Add(-time.Second)) || e.Start.After(time.Now().Add(time.Second)) {
		t.Errorf("start %v, the packet was sent at %v", e.Start, before)
	}

	// Another flow, whose entry Dump's filter must drop.
	if _, err := conn.WriteToUDP([]byte("x"), &net.UDPAddr{IP: net.IPv4(10, 96, 0, 11), Port: 53}); err != nil {
		t.Fatal(err)
	}
	all, err := Dump(path, nil)
	if err != nil {
		t.Fatalf("Dump: %v", err)
	}
	kept, err := Dump(path, func(e Entry) bool { return e.Orig.Dst == orig.Dst })
	if err != nil {
		t.Fatalf("Dump: %v", err)
	}
	if len(all) != 2 || len(kept) != 1 || kept[0].Orig != orig || kept[0].ID != e.ID {
		t.Errorf("Dump: all %+v, kept %+v", all, kept)
	}

	if err := Delete(path, orig); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := Get(path, orig); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Delete: %v, want ErrNotFound", err)
	}
	if err := Delete(path, orig); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Delete: %v, want ErrNotFound", err)
	}
}
