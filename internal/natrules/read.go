package natrules

import (
	"context"
	"errors"
	"fmt"
)

// Read reads the NAT rules of the network namespace at netnsPath ("" = the
// caller's): nftables over netlink, and the nat tables that iptables-save
// and ip6tables-save print (legacy and nft variants, whichever this machine
// has). It fails only when no source could be read; a source that failed
// while another worked is a note in Table.Notes.
//
// Programs run inside the namespace from a thread that enters it, so the
// caller needs CAP_SYS_ADMIN for another namespace and CAP_NET_ADMIN for
// the rules.
func Read(ctx context.Context, netnsPath string) (*Table, error) {
	t := newTable()
	var errs []error
	nt, err := readNftCtx(ctx, netnsPath)
	if err != nil {
		errs = append(errs, fmt.Errorf("reading nftables: %w", err))
	} else {
		t.merge(nt)
	}
	for _, v6 := range []bool{false, true} {
		dumps, err := SaveIptables(ctx, netnsPath, v6)
		if err != nil {
			errs = append(errs, err)
		}
		for _, d := range dumps {
			t.merge(ParseIptablesSave(d.Tool, d.Text))
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("reading NAT rules: %w", err)
	}
	if len(t.Sources) == 0 {
		return nil, fmt.Errorf("reading NAT rules: %w", errors.Join(errs...))
	}
	for _, e := range errs {
		t.Notes = append(t.Notes, e.Error())
	}
	return t, nil
}

// readNftCtx gives up waiting for netlink when ctx ends; a stuck read is
// left behind.
func readNftCtx(ctx context.Context, netnsPath string) (*Table, error) {
	type result struct {
		t   *Table
		err error
	}
	c := make(chan result, 1)
	go func() {
		t, err := readNft(netnsPath)
		c <- result{t, err}
	}()
	select {
	case r := <-c:
		return r.t, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
