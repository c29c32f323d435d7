// Package ctentry reads the conntrack entries of a network namespace over
// ctnetlink: one entry by its original tuple (Get), every entry a filter
// keeps (Dump), and deletes one (Delete). ParseList reads the same entries
// from saved `conntrack -L` text or /proc/net/nf_conntrack.
//
// The contract:
//
//   - An Entry carries both tuples as netip.AddrPort with the protocol, the
//     IPS_* status bits, the timeout left when it was read, and the time
//     it was made when the namespace's timestamp extension
//     (net.netfilter.nf_conntrack_timestamp) was on at that moment; Start
//     is zero otherwise, never guessed.
//   - The reply tuple's source is the NAT target: for a DNATed entry
//     (DstNAT set), the backend every later packet of the flow goes to,
//     whatever the NAT rules say now. That is what makes a stale entry.
//   - Get and Delete report ErrNotFound (wrapped) when no entry has the
//     tuple; Delete removes only the entry Get saw (by ID), not one that
//     took its tuple since.
//   - Text has neither NAT bits nor start times: ParseList derives DstNAT
//     and SrcNAT from the tuples (as the kernel sets them) and leaves Start
//     zero.
//   - Each call opens its own netlink socket in the namespace and closes
//     it; nothing is kept open, so nothing holds a namespace alive.
//
// Reading needs CAP_NET_ADMIN in the namespace's owning user namespace.
package ctentry
