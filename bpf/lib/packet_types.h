/* What a packet hook knows of a packet: its own header parse (struct pkt)
 * and, for a DNS packet, its entry and DNS header (struct seen). Apart from
 * packet.h, which fills them in, because device_seen in maps.h holds one.
 */
#ifndef DNSRACE_LIB_PACKET_TYPES_H
#define DNSRACE_LIB_PACKET_TYPES_H

#include "vmlinux.h"
#include "dnsrace.h"

/* What the header parse of an skb found. */
struct pkt {
	struct tuple t;
	__u64 payload; /* kernel address of the UDP payload */
	__u32 payload_len;
	__u16 dns[2]; /* the payload's first 4 bytes (DNS id, flags), network order */
	bool dns_read; /* dns holds them (read with the headers) */
};

/* A DNS packet at a packet hook. */
struct seen {
	struct pkt p;
	struct nf_conn *ct; /* its conntrack entry, or NULL */
	struct tuple orig;  /* the entry's original tuple */
	__u32 netns;
	__u16 id;
	__u16 flags;  /* DNS header flags */
	__u8 ctinfo;
	bool response;
};

#endif /* DNSRACE_LIB_PACKET_TYPES_H */
