// Package pcapout writes the packets behind each incident to a pcapng file
// (pure Go: gopacket's pcapgo.NgWriter for the section and interface
// blocks, Enhanced Packet Blocks with an opt_comment written here, because
// NgWriter in gopacket v1.1.19 has no per-packet options).
//
// The packets are RECONSTRUCTED, not captured: the tracer's events carry
// headers (addresses, ports, DNS id, question) and no payload. Each packet
// is rebuilt as IPv4 or IPv6 + UDP + a DNS message holding the header and
// the question only (the RD bit set as stub resolvers send it); an answer
// carries the question and no records (the records are not traced). The
// link type is raw IP (no Ethernet: MAC addresses are not traced). Capture
// length equals the reconstructed length; the interface's snap length says
// 65535 and its description and the section comment say that the packets
// are reconstructed.
//
// Per incident it writes: every lost query (first lost query's 5-tuple:
// ports of later lost packets are not traced per packet), the sibling
// query of the A/AAAA pair when known (once: a sibling lost too is
// written as lost), the sibling's answer when it was answered, and the
// retry that ended the stall (its own id and ports). Timestamps: lost
// queries at their traced send times; the sibling at lost + |gap| (the
// order is not kept); an answer at its query's time (its arrival time is
// not traced); the retry at lost + stall_ms. Every packet's comment
// starts "dnsrace incident <id> <cause>[/<race>]" and says which role the
// packet has.
//
// A Writer is safe for concurrent use; Close flushes and closes the file.
package pcapout
