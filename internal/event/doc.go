// Package event defines what the kernel side of dnsrace reports, in the form
// user space works with: one Event per hook hit, decoded from the ring buffer
// record without allocating. The BPF programs in bpf/ fill the raw record;
// Decode turns it into an Event. Everything downstream (correlation,
// incidents, pcap, metrics) reads only this package's types, so a change of
// attach tier never reaches it.
package event
