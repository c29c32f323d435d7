package doctor

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// inNetNS runs fn on a locked OS thread inside the network namespace at
// path ("" runs it in place). The thread is never unlocked, so the runtime
// ends it afterwards and no goroutine runs in the wrong namespace. Programs
// started by fn inherit the thread's namespace.
func inNetNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open(path)
		if err != nil {
			errc <- fmt.Errorf("opening network namespace %s: %w", path, err)
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("entering network namespace %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// liveTimeout bounds each netlink conversation: doctor runs on sick nodes
// and must answer even when a kernel interface does not.
const liveTimeout = 10 * time.Second

// withTimeout runs fn and gives up waiting after d. A stuck fn is left
// behind; doctor exits soon after anyway.
func withTimeout(d time.Duration, what string, fn func() error) error {
	errc := make(chan error, 1)
	go func() { errc <- fn() }()
	select {
	case err := <-errc:
		return err
	case <-time.After(d):
		return fmt.Errorf("%s: no answer after %v", what, d)
	}
}

// liveIptables runs the iptables-save variants present on this machine in
// the namespace and parses their output together.
func liveIptables(ctx context.Context, netns string) (ruleFacts, []string, error) {
	var f ruleFacts
	var notes []string
	var tools []string
	for _, t := range []string{"iptables-legacy-save", "iptables-nft-save"} {
		if _, err := exec.LookPath(t); err == nil {
			tools = append(tools, t)
		}
	}
	if len(tools) == 0 {
		if _, err := exec.LookPath("iptables-save"); err == nil {
			tools = []string{"iptables-save"}
		}
	}
	if len(tools) == 0 {
		return f, nil, fmt.Errorf("no iptables-save in PATH")
	}
	var errs []string
	ran := 0
	for _, t := range tools {
		var out, stderr bytes.Buffer
		err := inNetNS(netns, func() error {
			cmd := exec.CommandContext(ctx, t)
			cmd.Stdout, cmd.Stderr = &out, &stderr
			return cmd.Run()
		})
		if err != nil {
			errs = append(errs, fmt.Sprintf("running %s: %v: %s", t, err, strings.TrimSpace(stderr.String())))
			continue
		}
		ran++
		rf := parseIptablesSave(t, out.String())
		notes = append(notes, fmt.Sprintf("%s: %d rules", t, rf.RuleSeen))
		f.merge(rf)
	}
	if ran == 0 {
		return f, notes, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return f, notes, nil
}

// liveNft reads the nftables ruleset over netlink. Rules written by
// iptables-nft (xt match/target expressions) are left to liveIptables.
func liveNft(netns string) (ruleFacts, error) {
	var f ruleFacts
	err := withTimeout(liveTimeout, "reading nftables over netlink", func() (err error) {
		f, err = liveNftRead(netns)
		return err
	})
	return f, err
}

func liveNftRead(netns string) (ruleFacts, error) {
	var f ruleFacts
	var opts []nftables.ConnOption
	if netns != "" {
		fh, err := os.Open(netns)
		if err != nil {
			return f, fmt.Errorf("opening network namespace %s: %w", netns, err)
		}
		defer fh.Close()
		opts = append(opts, nftables.WithNetNSFd(int(fh.Fd())))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return f, fmt.Errorf("opening nftables netlink: %w", err)
	}
	defer c.CloseLasting()
	chains, err := c.ListChains()
	if err != nil {
		return f, fmt.Errorf("listing nftables chains: %w", err)
	}
	nodeLocal := netip.MustParseAddr(nodeLocalIP).As4()
	for _, ch := range chains {
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return f, fmt.Errorf("listing rules of %s/%s: %w", ch.Table.Name, ch.Name, err)
		}
		where := fmt.Sprintf("%s %s/%s", familyName(ch.Table.Family), ch.Table.Name, ch.Name)
		for _, r := range rules {
			compat := false
			for _, e := range r.Exprs {
				switch e.(type) {
				case *expr.Match, *expr.Target:
					compat = true
				}
			}
			if compat {
				continue
			}
			f.RuleSeen++
			dns := strings.Contains(ch.Name, "dns")
			hasNodeLocal := false
			var lastPayload *expr.Payload
			for _, e := range r.Exprs {
				switch x := e.(type) {
				case *expr.Payload:
					lastPayload = x
				case *expr.Cmp:
					if lastPayload != nil && lastPayload.Base == expr.PayloadBaseTransportHeader &&
						lastPayload.Offset == 2 && lastPayload.Len == 2 && len(x.Data) == 2 &&
						binary.BigEndian.Uint16(x.Data) == 53 && x.Op == expr.CmpOpEq {
						dns = true
					}
					if bytes.Equal(x.Data, nodeLocal[:]) {
						hasNodeLocal = true
					}
				}
			}
			for _, e := range r.Exprs {
				switch x := e.(type) {
				case *expr.Numgen:
					if x.Type == unix.NFT_NG_RANDOM && x.Modulus > 0 {
						f.LB = append(f.LB, lbChain{Source: "nftables", Chain: where, Endpoints: int(x.Modulus), DNS: dns})
					}
				case *expr.Masq:
					f.NAT = append(f.NAT, natRule{Source: "nftables", Where: where, Kind: "masquerade",
						Random: x.Random, FullyRandom: x.FullyRandom, Text: "masquerade" + nftFlags(x.Random, x.FullyRandom)})
				case *expr.NAT:
					if x.Type == expr.NATTypeSourceNAT {
						f.NAT = append(f.NAT, natRule{Source: "nftables", Where: where, Kind: "snat",
							Random: x.Random, FullyRandom: x.FullyRandom, Text: "snat" + nftFlags(x.Random, x.FullyRandom)})
					}
				case *expr.Notrack:
					if hasNodeLocal {
						f.Notrack = append(f.Notrack, "nftables: "+where+": notrack for "+nodeLocalIP)
					}
				}
			}
		}
	}
	return f, nil
}

func nftFlags(random, fully bool) string {
	switch {
	case fully:
		return " fully-random"
	case random:
		return " random"
	}
	return ""
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprintf("family%d", f)
}
