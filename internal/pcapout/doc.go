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
// The question is built byte for byte from an event.Name (a name's labels
// as the query carried them, whatever their bytes; not a dotted string
// parsed back), as far as the trace held it. The kernel copies at most 272
// bytes of a DNS message, fewer when the packet's first segment is
// shorter, so a name can be cut: the packet then asks the labels traced
// whole, and its comment says where the trace ended and what of the next
// label it held; no label is made up. A correlate.Incident carries only
// the name's shown form (QName: '?' for a byte outside printable ASCII or
// a dot inside a label, at most event.MaxName bytes, cut or not), so
// WriteIncident and Packets rebuild the Name from that: the name sent for
// a shown form without '?' and shorter than event.MaxName (unless the trace
// cut the name, which the shown form does not tell); otherwise the comment
// says that the shown form may not be the name sent. Writing the name as
// sent needs the incident to carry its event.Name.
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
