package pcapout

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/event"
)

// SnapLength is the interface's declared snap length.
const SnapLength = 65535

// Description is the interface description written to every file.
const Description = "dnsrace: packets RECONSTRUCTED from traced headers (IP, UDP, DNS header and question; no answer records, no MAC addresses), not captured"

// Packet is one reconstructed packet.
type Packet struct {
	Time    time.Time
	Data    []byte
	Comment string
}

// Writer writes incidents' packets to a pcapng file.
type Writer struct {
	mu      sync.Mutex
	f       io.WriteCloser
	bw      *bufio.Writer
	ng      *pcapgo.NgWriter
	packets int
	err     error
}

// Create creates path and writes the section and interface blocks.
func Create(path string) (*Writer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("creating pcap file: %w", err)
	}
	w, err := NewWriter(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return w, nil
}

// NewWriter writes to wc (closed by Close).
func NewWriter(wc io.WriteCloser) (*Writer, error) {
	bw := bufio.NewWriter(wc)
	intf := pcapgo.NgInterface{
		Name: "dnsrace", Description: Description, OS: "linux",
		LinkType: layers.LinkTypeRaw, TimestampResolution: 9, SnapLength: SnapLength,
	}
	opts := pcapgo.DefaultNgWriterOptions
	opts.SectionInfo.Application = "dnsrace"
	opts.SectionInfo.Comment = Description
	ng, err := pcapgo.NewNgWriterInterface(bw, intf, opts)
	if err != nil {
		return nil, fmt.Errorf("writing pcapng headers: %w", err)
	}
	return &Writer{f: wc, bw: bw, ng: ng}, nil
}

// WriteIncident writes the incident's packets.
func (w *Writer) WriteIncident(inc *correlate.Incident) error {
	return w.writeIncident(inc, questionOf(inc))
}

func (w *Writer) writeIncident(inc *correlate.Incident, q question) error {
	pkts, err := packets(inc, q)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	// NgWriter buffers: flush it so our blocks follow its own in order.
	if err := w.ng.Flush(); err != nil {
		w.err = fmt.Errorf("writing pcap: %w", err)
		return w.err
	}
	for _, p := range pkts {
		if _, err := w.bw.Write(enhancedPacketBlock(p)); err != nil {
			w.err = fmt.Errorf("writing pcap: %w", err)
			return w.err
		}
		w.packets++
	}
	if err := w.bw.Flush(); err != nil {
		w.err = fmt.Errorf("writing pcap: %w", err)
	}
	return w.err
}

// Packets returns how many packets were written.
func (w *Writer) Packets() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.packets
}

// Close flushes and closes the file.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	err := w.ng.Flush()
	if err2 := w.bw.Flush(); err == nil {
		err = err2
	}
	if err2 := w.f.Close(); err == nil {
		err = err2
	}
	if err != nil {
		return fmt.Errorf("closing pcap file: %w", err)
	}
	return nil
}

// enhancedPacketBlock encodes one EPB (interface 0, nanosecond timestamps
// as declared by the interface block) with an opt_comment.
func enhancedPacketBlock(p Packet) []byte {
	pad := func(n int) int { return (4 - n&3) & 3 }
	comment := []byte(p.Comment)
	optLen := 0
	if len(comment) > 0 {
		optLen = 4 + len(comment) + pad(len(comment)) + 4 // comment + opt_endofopt
	}
	total := 28 + len(p.Data) + pad(len(p.Data)) + optLen + 4
	b := make([]byte, 0, total)
	le := binary.LittleEndian
	ts := uint64(p.Time.UnixNano())
	b = le.AppendUint32(b, 6) // Enhanced Packet Block
	b = le.AppendUint32(b, uint32(total))
	b = le.AppendUint32(b, 0) // interface id
	b = le.AppendUint32(b, uint32(ts>>32))
	b = le.AppendUint32(b, uint32(ts))
	b = le.AppendUint32(b, uint32(len(p.Data)))
	b = le.AppendUint32(b, uint32(len(p.Data)))
	b = append(b, p.Data...)
	b = append(b, make([]byte, pad(len(p.Data)))...)
	if len(comment) > 0 {
		b = le.AppendUint16(b, 1) // opt_comment
		b = le.AppendUint16(b, uint16(len(comment)))
		b = append(b, comment...)
		b = append(b, make([]byte, pad(len(comment)))...)
		b = le.AppendUint32(b, 0) // opt_endofopt
	}
	b = le.AppendUint32(b, uint32(total))
	return b
}

// question is the name the packets ask, and what their comments say about
// it (a note starting "; ", or "").
type question struct {
	name event.Name
	note string
}

// asked is the question of a name as the query carried it: its labels
// traced whole, and a note when the trace cut it. (An incident does not
// carry its name as sent yet, only its shown form: see questionOf. The
// tests write names as sent through it.)
func asked(n event.Name) question {
	q := question{name: n}
	if n.Cut() {
		q.note = fmt.Sprintf("; question name CUT by the trace after %d bytes: written to its last label traced whole, the rest not known", len(n.Wire()))
		if rest := n.Wire()[len(n.Labels()):]; rest != "" {
			q.note += fmt.Sprintf(" (%d of the next label's %d bytes traced: %q)", len(rest)-1, rest[0], rest[1:])
		}
	}
	return q
}

// questionOf is an incident's question. A correlate.Incident carries the
// name in its shown form only (QName: '?' for a byte outside printable
// ASCII or a dot inside a label, at most event.MaxName bytes, and whether
// the trace cut it is not kept), so the labels are rebuilt from that: the
// name as sent unless the shown form says otherwise, and then the note
// says that it may not be. (A name the trace cut inside a label shows as
// a shorter whole name; nothing here can tell.)
func questionOf(inc *correlate.Incident) question {
	if inc.Name != (event.Name{}) {
		return asked(inc.Name)
	}
	var d event.DNS
	if inc.QName == "." { // the root (QName's form)
		d.SetQName("")
	} else {
		d.SetQName(inc.QName)
	}
	q := question{name: d.Name()}
	var may []string
	if strings.IndexByte(inc.QName, '?') >= 0 {
		may = append(may, "a '?' may stand for another byte or a dot inside a label")
	}
	if len(inc.QName) >= event.MaxName {
		may = append(may, fmt.Sprintf("the name and its last label may go on past its %d bytes", event.MaxName))
	}
	if q.name.Cut() {
		may = append(may, "written up to its first label that is empty or past 63 bytes")
	}
	if len(may) > 0 {
		q.note = "; question name rebuilt from its shown form: " + strings.Join(may, "; ")
	}
	return q
}

// Packets reconstructs an incident's packets (see the package comment).
func Packets(inc *correlate.Incident) ([]Packet, error) {
	return packets(inc, questionOf(inc))
}

func packets(inc *correlate.Incident, q question) ([]Packet, error) {
	src, dst := inc.Src, inc.Dst
	if !src.IsValid() || !dst.IsValid() {
		return nil, fmt.Errorf("incident %d has no 5-tuple", inc.ID)
	}
	head := fmt.Sprintf("dnsrace incident %d %s", inc.ID, inc.Cause)
	if inc.Race != nil {
		head += "/" + *inc.Race
	}
	var ctx []string
	if inc.Pod != "" {
		if inc.Namespace != "" {
			ctx = append(ctx, "pod "+inc.Namespace+"/"+inc.Pod)
		} else {
			ctx = append(ctx, inc.Pod)
		}
	}
	if inc.StallMs != nil && inc.Cause != correlate.CauseClashResolved {
		ctx = append(ctx, fmt.Sprintf("stalled %.0f ms", *inc.StallMs))
	}
	if w := inc.Winner; w != nil {
		ctx = append(ctx, fmt.Sprintf("winner %s->%s", w.Src, w.Dst))
	}
	tail := ""
	if len(ctx) > 0 {
		tail = "; " + strings.Join(ctx, "; ")
	}
	var out []Packet
	var first uint64
	for i, l := range inc.Lost {
		if i == 0 {
			first = l.SentNs
		}
		data, err := build(src, dst, l.ID, q.name, l.QType, false)
		if err != nil {
			return nil, fmt.Errorf("building incident %d packet: %w", inc.ID, err)
		}
		c := fmt.Sprintf("%s: LOST query %s id %d", head, l.QType, l.ID)
		if l.Dropped() {
			c += " (" + l.DropSite() + ")"
		}
		if i > 0 {
			c += "; 5-tuple of the first lost query"
		}
		c += q.note
		t := inc.Time
		if l.SentNs >= first {
			t = t.Add(time.Duration(l.SentNs - first))
		}
		out = append(out, Packet{Time: t, Data: data, Comment: c + tail})
	}
	if s := inc.Sibling; s != nil && !lostID(inc, s.ID, s.QType) {
		t := inc.Time.Add(time.Duration(s.GapUs * 1e3))
		data, err := build(src, dst, s.ID, q.name, s.QType, false)
		if err != nil {
			return nil, fmt.Errorf("building incident %d packet: %w", inc.ID, err)
		}
		out = append(out, Packet{Time: t, Data: data,
			Comment: fmt.Sprintf("%s: sibling query %s id %d (gap %.0f µs; order not traced)%s%s", head, s.QType, s.ID, s.GapUs, q.note, tail)})
		if s.Answered {
			data, err := build(dst, src, s.ID, q.name, s.QType, true)
			if err != nil {
				return nil, fmt.Errorf("building incident %d packet: %w", inc.ID, err)
			}
			out = append(out, Packet{Time: t, Data: data,
				Comment: fmt.Sprintf("%s: answer to sibling %s id %d (records and arrival time not traced)%s%s", head, s.QType, s.ID, q.note, tail)})
		}
	}
	if r := inc.Retry; r != nil && inc.StallMs != nil {
		if r.Src.IsValid() && r.Dst.IsValid() {
			data, err := build(r.Src, r.Dst, r.ID, q.name, r.QType, false)
			if err != nil {
				return nil, fmt.Errorf("building incident %d packet: %w", inc.ID, err)
			}
			out = append(out, Packet{Time: inc.Time.Add(time.Duration(*inc.StallMs * 1e6)), Data: data,
				Comment: fmt.Sprintf("%s: RETRY %s id %d, %.0f ms after the lost query%s%s", head, r.QType, r.ID, *inc.StallMs, q.note, tail)})
		}
	}
	return out, nil
}

// lostID reports whether the query id/qtype is one of the lost packets
// (a sibling lost too is written once, as lost).
func lostID(inc *correlate.Incident, id uint16, qtype correlate.QType) bool {
	for _, l := range inc.Lost {
		if l.ID == id && l.QType == qtype {
			return true
		}
	}
	return false
}

// build serializes IP + UDP + DNS (header and question): the question
// name's labels traced whole, as the query carried them, then the root
// label.
func build(src, dst netip.AddrPort, id uint16, name event.Name, qtype correlate.QType, response bool) ([]byte, error) {
	payload := dnsMessage(id, name.Labels(), uint16(qtype), response)
	udp := &layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port())}
	var ip gopacket.SerializableLayer
	if src.Addr().Unmap().Is4() {
		ip4 := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP,
			SrcIP: src.Addr().Unmap().AsSlice(), DstIP: dst.Addr().Unmap().AsSlice()}
		_ = udp.SetNetworkLayerForChecksum(ip4)
		ip = ip4
	} else {
		ip6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP,
			SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
		_ = udp.SetNetworkLayerForChecksum(ip6)
		ip = ip6
	}
	buf := gopacket.NewSerializeBuffer()
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		ip, udp, gopacket.Payload(payload))
	if err != nil {
		return nil, fmt.Errorf("serializing packet: %w", err)
	}
	return buf.Bytes(), nil
}

// dnsMessage is a DNS message of a header and one question (labels, in
// wire form without the root label; qtype; class IN), with RD set, as stub
// resolvers send it, and in a response QR and RA.
func dnsMessage(id uint16, labels string, qtype uint16, response bool) []byte {
	flags := uint16(1 << 8) // RD
	if response {
		flags |= 1<<15 | 1<<7 // QR, RA
	}
	be := binary.BigEndian
	b := make([]byte, 0, 12+len(labels)+1+4)
	b = be.AppendUint16(b, id)
	b = be.AppendUint16(b, flags)
	b = be.AppendUint16(b, 1)       // QDCOUNT
	b = append(b, 0, 0, 0, 0, 0, 0) // ANCOUNT, NSCOUNT, ARCOUNT
	b = append(b, labels...)
	b = append(b, 0) // the root label
	b = be.AppendUint16(b, qtype)
	return be.AppendUint16(b, 1) // IN
}
