package ctentry

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// Lines as conntrack-tools 1.4.7 prints them (plain, -o extended with
// ktimestamp) and as /proc/net/nf_conntrack holds them.
func TestParseList(t *testing.T) {
	text := `udp      17 29 src=10.251.0.1 dst=10.96.0.10 sport=40053 dport=53 [UNREPLIED] src=10.244.1.5 dst=10.251.0.1 sport=53 dport=40053 mark=0 delta-time=0 use=1
tcp      6 119 SYN_SENT src=10.251.0.1 dst=10.96.0.10 sport=48628 dport=53 [UNREPLIED] src=10.244.1.5 dst=10.251.0.1 sport=53 dport=48628 mark=0 delta-time=0 use=1
ipv4     2 udp      17 171 src=10.1.0.7 dst=10.96.0.10 sport=36611 dport=53 src=10.240.0.12 dst=192.168.0.4 sport=53 dport=1025 [ASSURED] mark=0 delta-time=9 [start=Sun Dec  6 18:29:05 2026] use=1
ipv6     10 udp      17 20 src=fd00::1 dst=fd00::53 sport=5000 dport=53 src=fd00::53 dst=fd00::1 sport=53 dport=5000 mark=7 zone=3 use=2
icmp     1 29 src=10.0.0.1 dst=10.0.0.2 type=8 code=0 id=7 src=10.0.0.2 dst=10.0.0.1 type=0 code=0 id=7 mark=0 use=1
conntrack v1.4.7 (conntrack-tools): 5 flow entries have been shown.
udp 17 x src=1.2.3.4
udp 17 29 src=10.0.0.1 dst=10.0.0.2 sport=1 dport=2 src=10.0.0.2 dst=10.0.0.1 sport=2 dport=1 src=10.0.0.3
`
	es, bad := ParseList(text)
	if bad != 2 || len(es) != 5 {
		t.Fatalf("%d entries, %d bad: %+v", len(es), bad, es)
	}
	e := es[0]
	if e.Orig.String() != "udp 10.251.0.1:40053 -> 10.96.0.10:53" || e.Reply.String() != "udp 10.244.1.5:53 -> 10.251.0.1:40053" ||
		e.Timeout != 29*time.Second || e.Status != Confirmed|DstNAT || !e.Start.IsZero() {
		t.Errorf("first: %+v", e)
	}
	if es[1].Orig.Proto != 6 || es[1].Timeout != 119*time.Second {
		t.Errorf("tcp: %+v", es[1])
	}
	if e := es[2]; e.Status != Confirmed|SeenReply|Assured|DstNAT|SrcNAT || e.DNATTarget() != netip.MustParseAddrPort("10.240.0.12:53") {
		t.Errorf("extended: %+v", e)
	}
	if e := es[3]; e.Status != Confirmed|SeenReply || e.Mark != 7 || e.Zone != 3 || !e.Orig.Dst.Addr().Is6() {
		t.Errorf("proc ipv6: %+v", e)
	}
	if e := es[4]; e.Orig.Src.Port() != 0 || e.Status&DstNAT != 0 {
		t.Errorf("icmp: %+v", e)
	}
}

// FuzzParseList: any text parses without panicking, every entry has both
// tuples of one protocol, and the NAT bits agree with the tuples.
func FuzzParseList(f *testing.F) {
	f.Add("udp      17 29 src=10.251.0.1 dst=10.96.0.10 sport=40053 dport=53 [UNREPLIED] src=10.244.1.5 dst=10.251.0.1 sport=53 dport=40053 mark=0 use=1\n")
	f.Add("ipv4     2 udp      17 171 src=10.1.0.7 dst=10.96.0.10 sport=36611 dport=53 src=10.240.0.12 dst=192.168.0.4 sport=53 dport=1025 [ASSURED] mark=0 zone=1 use=1\n")
	f.Add("ipv4 2\nudp 17\nudp 17 1 src=::1 src=::1 dst=::1 dst=::1\n")
	f.Fuzz(func(t *testing.T, s string) {
		es, bad := ParseList(s)
		if lines := strings.Count(s, "\n") + 1; len(es)+bad > lines {
			t.Errorf("%d entries and %d bad lines from %d lines", len(es), bad, lines)
		}
		for _, e := range es {
			if !e.Orig.Src.Addr().IsValid() || !e.Reply.Dst.Addr().IsValid() || e.Orig.Proto != e.Reply.Proto {
				t.Errorf("entry %+v", e)
			}
			if (e.Status&DstNAT != 0) != (e.Reply.Src != e.Orig.Dst) {
				t.Errorf("DST_NAT %v for %+v", e.Status&DstNAT != 0, e)
			}
		}
	})
}
