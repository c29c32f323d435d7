// Package dnsserver is the lab's authoritative DNS server: it answers every
// A and AAAA question with a fixed address, counts what it received and
// answered, and can misbehave on purpose the way real upstreams do: ignore a
// fraction of queries (upstream loss), or answer from an address other than
// the one queried (a multi-homed server bound to 0.0.0.0), which the client's
// NAT cannot map back.
//
// Messages are parsed and built with github.com/miekg/dns; the socket loop
// is our own so the server controls which socket each reply leaves from.
// Each server binds one address: binding 0.0.0.0 on a host with several
// addresses is exactly the wrong-source bug the lab reproduces on purpose.
package dnsserver
