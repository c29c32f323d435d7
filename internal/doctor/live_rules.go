package doctor

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/natrules"
)

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
	dumps, err := natrules.SaveIptables(ctx, netns, false)
	if len(dumps) == 0 {
		if err == nil {
			err = fmt.Errorf("no iptables-save output")
		}
		return f, nil, fmt.Errorf("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	for _, d := range dumps {
		rf := parseIptablesSave(d.Tool, d.Text)
		notes = append(notes, fmt.Sprintf("%s: %d rules", d.Tool, rf.RuleSeen))
		f.merge(rf)
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
		where := fmt.Sprintf("%s %s/%s", natrules.FamilyName(ch.Table.Family), ch.Table.Name, ch.Name)
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
