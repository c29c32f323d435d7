// Package event defines what the kernel side of dnsrace reports, in the form
// user space works with: one Event per ring buffer record, decoded without
// allocating. The kernel side owns each DNS flow and sends a Query record
// when a query is first seen (with its question), an Answer record when its
// answer reaches the asker, and an evidence record (drop, confirm verdict,
// merge, NAT_CLASH insert, freed unconfirmed entry, late winner, full
// receive buffer, a namespace's first DNS entry) only when something
// happens that must be explained; every record names its query by the
// kernel's query id (QID). Decode turns a raw record (struct rec_query,
// rec_answer or rec_event of bpf/dnsrace.h, variable length) into an Event.
// Everything downstream (correlation, incidents, pcap, metrics) reads only
// this package's types, so a change of attach tier never reaches it.
package event
