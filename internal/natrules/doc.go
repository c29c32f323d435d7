// Package natrules answers, for one network namespace and at one moment:
// which backends do its NAT rules DNAT a VIP (address, port, UDP or TCP)
// to? It is the "current backends" side of a stale conntrack entry: an
// entry whose reply source (its NAT target) is not among them was made by
// rules that no longer exist.
//
// The contract:
//
//   - Read takes the namespace's nftables rules over netlink and its
//     iptables nat tables through iptables-save and ip6tables-save (legacy
//     and nft variants), and walks every chain a packet enters at the NAT
//     hooks DNAT happens in (prerouting and output), following jump and
//     goto verdicts, verdict maps and set lookups. ParseIptablesSave does
//     the same for a saved dump.
//   - A rule's conditions on the destination address, the layer 4
//     protocol and the destination port are followed exactly (equal, not
//     equal, prefixes, port ranges, the keys of a concatenated verdict map
//     such as kube-proxy's service-ips). Every other condition (source,
//     interface, mark, statistic, numgen, hash, addrtype, fib, ...) may or
//     may not hold, so both ways are taken: a backend that some packet to
//     the VIP can reach is listed, even if only some packets reach it.
//     A chain stops being walked for a VIP after a rule that surely ends
//     its packets there (a DNAT, accept, drop, goto, or a jump into a chain
//     that surely does), so a DNAT shadowed by an earlier one is not listed.
//   - A service is keyed by the VIP's address, port and protocol as the
//     rules match them; a port or protocol the rules do not match is "any"
//     (0), and Table.Backends counts those too. A DNAT without a port keeps
//     the VIP's port. A DNAT reached for packets whose destination address
//     the rules never pinned to one address (NodePorts: any local address,
//     a prefix) names no VIP and is left out.
//   - What is not understood is never guessed: a DNAT whose address comes
//     from a map, REDIRECT, an unreadable set, a rule with iptables-nft's
//     xt expressions seen over netlink (those are read through
//     iptables-nft-save instead) end up in Table.Notes, not in the table.
//
// The package reads only; it needs CAP_NET_ADMIN, and CAP_SYS_ADMIN for a
// namespace other than the caller's.
package natrules
