package pcapout_test

import (
	"bytes"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
	"github.com/miekg/dns"

	"github.com/dnsrace/dnsrace/internal/bpf"
	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/pcapout"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

func incident() *correlate.Incident {
	race := correlate.RaceReplyClash
	stall := 5002.0
	return &correlate.Incident{
		Type: "incident", ID: 7, Time: time.Date(2026, 11, 30, 15, 2, 27, 195e6, time.UTC),
		Cause: correlate.CauseInsertRace, Race: &race, QName: "svc-02.lab.test", QType: correlate.QType(dns.TypeA),
		Src: netip.MustParseAddrPort("10.244.0.12:53611"), Dst: netip.MustParseAddrPort("10.96.0.10:53"), StallMs: &stall, Retried: true,
		Lost: []correlate.Packet{{QType: correlate.QType(dns.TypeA), ID: 50852, Cause: correlate.CauseInsertRace, Reason: "NETFILTER_DROP",
			Location: "nf_hook_slow+0x7d", NetNS: 4026532177, SentNs: 1000}},
		Sibling:   &correlate.Sibling{QType: correlate.QType(dns.TypeAAAA), ID: 50853, GapUs: 86, Answered: true},
		Retry:     &correlate.Retry{QType: correlate.QType(dns.TypeA), ID: 50852, Src: netip.MustParseAddrPort("10.244.0.12:53611"), Dst: netip.MustParseAddrPort("10.96.0.10:53")},
		Winner:    &correlate.Flow{Src: netip.MustParseAddrPort("10.244.0.11:33808"), Dst: netip.MustParseAddrPort("10.96.0.10:53")},
		Pod:       "checkout-7f9c",
		Namespace: "shop",
	}
}

func incident6() *correlate.Incident {
	inc := incident()
	inc.ID, inc.Src, inc.Dst, inc.Sibling, inc.Retry = 8, netip.MustParseAddrPort("[fd00::a]:40000"), netip.MustParseAddrPort("[fd00::53]:53"), nil, nil
	return inc
}

// A sibling that was lost too is written once, as lost.
func TestSiblingLostToo(t *testing.T) {
	inc := incident()
	inc.Lost = append(inc.Lost, correlate.Packet{QType: correlate.QType(dns.TypeAAAA), ID: 50853, SentNs: 1090})
	inc.Sibling.Answered, inc.Sibling.Lost = false, true
	pkts, err := pcapout.Packets(inc)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkts) != 3 {
		t.Fatalf("%d packets, want 3 (A and AAAA lost, the retry)", len(pkts))
	}
	if !strings.Contains(pkts[2].Comment, "RETRY A id 50852") {
		t.Errorf("third packet: %q", pkts[2].Comment)
	}
	if !strings.Contains(pkts[1].Comment, "LOST query AAAA id 50853") {
		t.Errorf("second packet: %q", pkts[1].Comment)
	}
	if d := pkts[1].Time.Sub(pkts[0].Time); d != 90 {
		t.Errorf("second packet %v after the first, want 90ns", d)
	}
}

func TestWriteAndRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.pcapng")
	w, err := pcapout.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, inc := range []*correlate.Incident{incident(), incident6()} {
		if err := w.WriteIncident(inc); err != nil {
			t.Fatal(err)
		}
	}
	r := closeAndRead(t, w, path)
	if r.SectionInfo().Comment != pcapout.Description {
		t.Errorf("section comment %q", r.SectionInfo().Comment)
	}
	n := 0
	for {
		_, ci, err := r.ReadPacketData()
		if err != nil {
			break
		}
		if n == 0 && !ci.Timestamp.Equal(incident().Time) {
			t.Errorf("first packet at %v, want %v", ci.Timestamp, incident().Time)
		}
		n++
	}
	if n != 5 {
		t.Errorf("read %d packets, want 5 (lost, sibling, answer, retry; lost v6)", n)
	}
	if w.Packets() != 5 {
		t.Errorf("writer counted %d packets", w.Packets())
	}
	checkTcpdump(t, path, []string{
		"10.244.0.12.53611 > 10.96.0.10.53: 50852+ A? svc-02.lab.test.",
		"10.244.0.12.53611 > 10.96.0.10.53: 50853+ AAAA? svc-02.lab.test.",
		"10.96.0.10.53 > 10.244.0.12.53611: 50853 0/0/0",
		"10.244.0.12.53611 > 10.96.0.10.53: 50852+ A? svc-02.lab.test.",
		"fd00::a.40000 > fd00::53.53: 50852+ A? svc-02.lab.test.",
	})
	checkComments(t, path, []string{
		"dnsrace incident 7 insert_race/reply_clash: LOST query A id 50852 (NETFILTER_DROP at nf_hook_slow+0x7d in netns 4026532177); pod shop/checkout-7f9c; stalled 5002 ms",
		"dnsrace incident 7 insert_race/reply_clash: sibling query AAAA id 50853",
		"dnsrace incident 7 insert_race/reply_clash: answer to sibling AAAA id 50853",
		"dnsrace incident 7 insert_race/reply_clash: RETRY A id 50852, 5002 ms after the lost query",
		"dnsrace incident 8 insert_race/reply_clash: LOST query A id 50852",
	})
}

// checkTcpdump re-reads the file with tcpdump and wants each line in order.
func checkTcpdump(t *testing.T, path string, want []string) {
	t.Helper()
	if _, err := exec.LookPath("tcpdump"); err != nil {
		testutil.SkipOrFail(t, "tcpdump is not installed (scripts/install-deps installs it)")
	}
	out, err := exec.Command("tcpdump", "-nr", path).CombinedOutput()
	if err != nil {
		t.Fatalf("tcpdump -nr: %v\n%s", err, out)
	}
	text := string(out)
	for _, w := range want {
		i := strings.Index(text, w)
		if i < 0 {
			t.Errorf("tcpdump output lacks %q:\n%s", w, out)
			continue
		}
		text = text[i+len(w):]
	}
}

// checkComments reads the packets' comments with tshark when it is there
// (it is optional: tcpdump does not print pcapng comments).
func checkComments(t *testing.T, path string, want []string) {
	t.Helper()
	if _, err := exec.LookPath("tshark"); err != nil {
		t.Log("tshark not installed: packet comments not checked by a third-party reader")
		return
	}
	out, err := exec.Command("tshark", "-r", path, "-T", "fields", "-e", "frame.comment").CombinedOutput()
	if err != nil {
		t.Fatalf("tshark -r: %v\n%s", err, out)
	}
	text := string(out)
	for _, w := range want {
		i := strings.Index(text, w)
		if i < 0 {
			t.Errorf("tshark comments lack %q:\n%s", w, out)
			continue
		}
		text = text[i+len(w):]
	}
}

// A query type without a mnemonic (RFC 3597 "TYPEn") is written with its
// number, and one incident that cannot be written leaves the writer usable.
func TestUnnamedQType(t *testing.T) {
	inc := incident()
	inc.QType, inc.Lost[0].QType, inc.Retry.QType, inc.Sibling = 65280, 65280, 65280, nil
	pkts, err := pcapout.Packets(inc)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkts) != 2 {
		t.Fatalf("%d packets, want 2 (lost query, retry)", len(pkts))
	}
	var m dns.Msg
	// raw IPv4 (20 bytes) + UDP (8): the DNS message follows
	if err := m.Unpack(pkts[0].Data[28:]); err != nil {
		t.Fatal(err)
	}
	if got := m.Question[0].Qtype; got != 65280 {
		t.Errorf("qtype %d, want 65280", got)
	}

	w, err := pcapout.Create(filepath.Join(t.TempDir(), "out.pcapng"))
	if err != nil {
		t.Fatal(err)
	}
	bad := incident()
	bad.Src = netip.AddrPort{}
	if err := w.WriteIncident(bad); err == nil {
		t.Error("an incident without a 5-tuple was written")
	}
	if err := w.WriteIncident(inc); err != nil {
		t.Errorf("the writer stopped after one bad incident: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if w.Packets() != 2 {
		t.Errorf("%d packets written, want 2", w.Packets())
	}
}

// tracedName is the question name of a QUERY record holding msg (the
// bytes of the DNS message the kernel copied), as event decodes it.
func tracedName(t *testing.T, msg string) event.Name {
	t.Helper()
	var q bpf.DnsraceRecQuery
	q.H.Type, q.DnsLen = uint8(bpf.DnsraceRecTypeREC_QUERY), uint16(len(msg))
	raw := append(append([]byte{}, unsafe.Slice((*byte)(unsafe.Pointer(&q)), unsafe.Sizeof(q))...), msg...)
	var e event.Event
	if err := event.Decode(raw, &e); err != nil {
		t.Fatal(err)
	}
	return e.DNS.Name()
}

// The question of every packet holds the name's labels as the query sent
// them, whatever their bytes, up to 255 bytes of labels (a message that
// fills the record); of a name the trace cut, the labels traced whole, and
// the comment says it was cut.
func TestNameAsSent(t *testing.T) {
	hdr := "\xc6\xa4\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
	tail := "\x00\x00\x01\x00\x01" // root label, A, IN
	odd := "\x03a.b\x05\x00\x07\xff \\\x03lab\x04test"
	x63 := "\x3f" + strings.Repeat("x", 63)
	longest := x63 + x63 + x63 + "\x3e" + strings.Repeat("y", 62) // 255 bytes
	if n := len(hdr + longest + tail); n != event.RawDNSCap {
		t.Fatalf("the longest name's message has %d bytes, a record %d", n, event.RawDNSCap)
	}
	cases := []struct {
		name   string
		traced string // the DNS bytes the record holds
		labels string // the labels the packet must ask
		note   string // in every packet's comment when cut
	}{
		{"odd bytes", hdr + odd + tail, odd, ""},
		{"longest", hdr + longest + tail, longest, ""},
		{"cut inside a label", (hdr + longest + tail)[:12+188], x63 + x63,
			`; question name CUT by the trace after 188 bytes: written to its last label traced whole, the rest not known (59 of the next label's 63 bytes traced: "` + strings.Repeat("x", 59) + `"); pod`},
		{"cut after a label", (hdr + longest + tail)[:12+192], x63 + x63 + x63,
			"; question name CUT by the trace after 192 bytes: written to its last label traced whole, the rest not known; pod"},
	}
	path := filepath.Join(t.TempDir(), "out.pcapng")
	w, err := pcapout.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		name := tracedName(t, c.traced)
		pkts, err := pcapout.PacketsAsking(incident(), name)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pkts {
			if c.note == "" && strings.Contains(p.Comment, "question name") || !strings.Contains(p.Comment, c.note) {
				t.Errorf("%s: comment %q, want it to say %q", c.name, p.Comment, c.note)
			}
		}
		if err := w.WriteIncidentAsking(incident(), name); err != nil {
			t.Fatal(err)
		}
	}
	r := closeAndRead(t, w, path)
	const perIncident = 4 // lost, sibling, its answer, retry
	n := 0
	for ; ; n++ {
		data, _, err := r.ReadPacketData()
		if err != nil {
			break
		}
		if n >= len(cases)*perIncident {
			continue
		}
		c := cases[n/perIncident]
		p := gopacket.NewPacket(data, layers.LayerTypeIPv4, gopacket.Default)
		udp, _ := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if udp == nil || len(udp.Payload) < 12 {
			t.Fatalf("%s: packet %d has no DNS message: %v", c.name, n, p)
		}
		qtype := "\x00\x01" // A, the lost query's and the retry's
		if n%perIncident == 1 || n%perIncident == 2 {
			qtype = "\x00\x1c" // AAAA, the sibling's
		}
		if q, want := udp.Payload[12:], c.labels+"\x00"+qtype+"\x00\x01"; string(q) != want {
			t.Errorf("%s: packet %d asks %q, want %q", c.name, n, q, want)
		}
		// gopacket's decoder takes it as the DNS message it is.
		if d, _ := p.Layer(layers.LayerTypeDNS).(*layers.DNS); d == nil || p.ErrorLayer() != nil ||
			len(d.Questions) != 1 || !bytes.Equal(d.Questions[0].Name, []byte(shownByGopacket(c.labels))) {
			t.Errorf("%s: packet %d: gopacket decodes %v (error %v)", c.name, n, p.Layer(layers.LayerTypeDNS), p.ErrorLayer())
		}
	}
	if n != len(cases)*perIncident {
		t.Errorf("read %d packets, want %d", n, len(cases)*perIncident)
	}
	// tcpdump shows a control byte as ^X, a byte past 0x7f as M-, a dot
	// inside a label as a dot; (n) is the DNS message's length.
	x, y := strings.Repeat("x", 63), strings.Repeat("y", 62)
	checkTcpdump(t, path, []string{
		`10.244.0.12.53611 > 10.96.0.10.53: 50852+ A? a.b.^@^GM-^? \.lab.test. (36)`,
		`10.244.0.12.53611 > 10.96.0.10.53: 50853+ AAAA? a.b.^@^GM-^? \.lab.test. (36)`,
		"50852+ A? " + x + "." + x + "." + x + "." + y + ". (272)",
		"50852+ A? " + x + "." + x + ". (145)",
		"50852+ A? " + x + "." + x + "." + x + ". (209)",
	})
}

// shownByGopacket is how gopacket shows labels: their bytes joined by dots.
func shownByGopacket(labels string) string {
	var parts []string
	for off := 0; off < len(labels); off += 1 + int(labels[off]) {
		parts = append(parts, labels[off+1:off+1+int(labels[off])])
	}
	return strings.Join(parts, ".")
}

// An incident carries its name's shown form only: the packets ask its
// labels, and the comment says when the shown form may not be the name
// sent.
func TestShownName(t *testing.T) {
	long := strings.Repeat("x", 63) + "." + strings.Repeat("x", 62) + ".y" // event.MaxName bytes, the most shown
	cases := []struct{ shown, labels, note string }{
		{"svc-02.lab.test", "\x06svc-02\x03lab\x04test", ""},
		{".", "", ""},
		{"a?b.lab", "\x03a?b\x03lab", "; question name rebuilt from its shown form: a '?' may stand for another byte or a dot inside a label"},
		{long, "\x3f" + long[:63] + "\x3e" + long[64:126] + "\x01y", "; question name rebuilt from its shown form: the name and its last label may go on past its 128 bytes"},
	}
	for _, c := range cases {
		inc := incident()
		inc.QName = c.shown
		pkts, err := pcapout.Packets(inc)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pkts {
			if c.note == "" && strings.Contains(p.Comment, "question name") || !strings.Contains(p.Comment, c.note) {
				t.Errorf("%q: comment %q, want it to say %q", c.shown, p.Comment, c.note)
			}
			// raw IPv4 (20 bytes) + UDP (8) + DNS header (12): the question
			if q := p.Data[40:]; string(q[:len(q)-4]) != c.labels+"\x00" {
				t.Errorf("%q: packet asks %q, want %q", c.shown, q, c.labels+"\x00")
			}
		}
	}
}

// closeAndRead closes w and opens what it wrote at path for reading back.
func closeAndRead(t *testing.T, w *pcapout.Writer, path string) *pcapgo.NgReader {
	t.Helper()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	r, err := pcapgo.NewNgReader(f, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
