package pcapout_test

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket/pcapgo"
	"github.com/miekg/dns"

	"github.com/dnsrace/dnsrace/internal/correlate"
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
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewNgReader(f, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatal(err)
	}
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
