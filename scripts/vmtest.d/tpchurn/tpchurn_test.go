//go:build linux

package tpchurn

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/nsutil"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// TestRawTracepointChurn attaches and detaches raw_tp/kmem_cache_free while
// namespaces with conntrack traffic come and go. It fails if an attach or a
// detach fails or if no namespace was torn down during the loop (then the
// loop proved nothing); a kernel that oopses never reports at all, which the
// vmtest matrix shows as fail(no-result) and the console as "Oops: int3".
func TestRawTracepointChurn(t *testing.T) {
	testutil.RequireRoot(t)
	iterations := testutil.EnvInt(t, "DNSRACE_TPCHURN_ITERATIONS", 300, 0)
	seconds := testutil.EnvInt(t, "DNSRACE_TPCHURN_SECONDS", 20, 0)
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatalf("removing the memlock limit: %v", err)
	}

	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "tpchurn",
		Type:         ebpf.RawTracepoint,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		testutil.SkipOrFail(t, fmt.Sprintf("loading a raw tracepoint program: %v", err))
	}
	defer prog.Close()

	stop := make(chan struct{})
	var torn, packets atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, runtime.NumCPU()+1)
	// One churner per CPU, so that kmem_cache_free runs everywhere.
	for w := 0; w < runtime.NumCPU(); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				n, err := pairRound(w, i)
				if err != nil {
					errc <- fmt.Errorf("churner %d round %d: %w", w, i, err)
					return
				}
				packets.Add(int64(n))
				torn.Add(1)
			}
		}()
	}

	start := time.Now()
	deadline := start.Add(time.Duration(seconds) * time.Second)
	done := 0
	var loopErr error
	for done < iterations && time.Now().Before(deadline) {
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: "kmem_cache_free", Program: prog})
		if err != nil {
			loopErr = fmt.Errorf("attach %d: %w", done, err)
			break
		}
		// A short and varying attached time, so that the patching of the
		// detach meets kmem_cache_free calls at every phase.
		time.Sleep(time.Duration(done%5) * 200 * time.Microsecond)
		if err := l.Close(); err != nil {
			loopErr = fmt.Errorf("detach %d: %w", done, err)
			break
		}
		done++
		if done%10 == 0 {
			// One line per 10 iterations: after an oops, the console shows
			// how far the loop got.
			fmt.Printf("TPCHURN iterations=%d namespaces_torn=%d packets=%d seconds=%.1f\n",
				done, torn.Load(), packets.Load(), time.Since(start).Seconds())
		}
	}
	close(stop)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if loopErr != nil {
		t.Fatal(loopErr)
	}
	t.Logf("TPCHURN done iterations=%d namespaces_torn=%d packets=%d seconds=%.1f",
		done, torn.Load(), packets.Load(), time.Since(start).Seconds())
	if done == 0 || torn.Load() == 0 {
		t.Fatalf("%d attach/detach iterations and %d namespace teardowns: the loop tested nothing", done, torn.Load())
	}
}

// pairRound creates two anonymous namespaces joined by a veth pair, turns
// conntrack on in both (an nft "ct state new counter" rule), sends UDP from
// 32 fresh sockets (32 conntrack entries on each side), and closes it all:
// the namespaces are freed by the kernel's netns cleanup work, which frees
// their conntrack entries through kmem_cache_free. Returns the packets sent.
func pairRound(w, i int) (int, error) {
	a, err := nsutil.NewAnonymous()
	if err != nil {
		return 0, err
	}
	defer a.Close()
	b, err := nsutil.NewAnonymous()
	if err != nil {
		return 0, err
	}
	defer b.Close()

	ha, err := netlink.NewHandleAt(a, unix.NETLINK_ROUTE)
	if err != nil {
		return 0, fmt.Errorf("opening netlink in namespace a: %w", err)
	}
	defer ha.Close()
	hb, err := netlink.NewHandleAt(b, unix.NETLINK_ROUTE)
	if err != nil {
		return 0, fmt.Errorf("opening netlink in namespace b: %w", err)
	}
	defer hb.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "tpa"}, PeerName: "tpb", PeerNamespace: netlink.NsFd(b)}
	if err := ha.LinkAdd(veth); err != nil {
		return 0, fmt.Errorf("adding the veth pair: %w (%s)", err, fdState(map[string]int{"namespace a": int(a), "namespace b": int(b)}))
	}
	addrA, addrB := net.IPv4(10, 99, 0, 1), net.IPv4(10, 99, 0, 2)
	for _, s := range []struct {
		h    *netlink.Handle
		name string
		ip   net.IP
	}{{ha, "tpa", addrA}, {hb, "tpb", addrB}} {
		l, err := s.h.LinkByName(s.name)
		if err != nil {
			return 0, fmt.Errorf("finding %s: %w", s.name, err)
		}
		if err := s.h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: s.ip, Mask: net.CIDRMask(24, 32)}}); err != nil {
			return 0, fmt.Errorf("addressing %s: %w", s.name, err)
		}
		if err := s.h.LinkSetUp(l); err != nil {
			return 0, fmt.Errorf("setting %s up: %w", s.name, err)
		}
	}
	if err := conntrackOn(a, nftables.ChainHookOutput); err != nil {
		return 0, err
	}
	if err := conntrackOn(b, nftables.ChainHookInput); err != nil {
		return 0, err
	}

	sent := 0
	err = nsutil.DoHandle(a, func() error {
		for k := 0; k < 32; k++ {
			c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: addrB, Port: 5300 + w})
			if err != nil {
				return fmt.Errorf("dialing: %w", err)
			}
			// A refused port answers with ICMP: more allocations and frees.
			_, werr := c.Write([]byte("tpchurn"))
			c.Close()
			if werr == nil {
				sent++
			}
		}
		return nil
	})
	return sent, err
}

// conntrackOn installs "ct state new counter" in a filter chain of ns: a ct
// expression makes the kernel register conntrack's hooks in that namespace.
func conntrackOn(ns netns.NsHandle, hook *nftables.ChainHook) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "tpchurn"})
	ch := c.AddChain(&nftables.Chain{Name: "c", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: hook, Priority: nftables.ChainPriorityFilter})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
		&expr.Counter{},
	}})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing the conntrack rule: %w", err)
	}
	return nil
}

// fdState says what the given file descriptors are now: an EBADF from a
// request that names one (the veth peer's namespace) means it was closed
// under the test, by a double close somewhere in the process.
func fdState(fds map[string]int) string {
	var parts []string
	for name, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
		if err != nil {
			target = "closed"
		}
		parts = append(parts, fmt.Sprintf("%s: fd %d -> %s", name, fd, target))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
