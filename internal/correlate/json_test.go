package correlate

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

// randString draws from the characters JSON escaping treats apart: plain
// ASCII, quotes and backslashes, control characters, HTML characters,
// multi-byte runes, U+2028/U+2029 and invalid UTF-8.
func randString(r *rand.Rand) string {
	pieces := []string{"a", "Z", "9", ".", "-", " ", `"`, `\`, "\x00", "\x01", "\x1f", "\b", "\f", "\n", "\r", "\t",
		"\x7f", "<", ">", "&", "é", "日", "\u2028", "\u2029", "\U0001F600", "\xff", "\xc3", "\xe2\x80", "\ufffd"}
	if r.IntN(4) == 0 {
		return ""
	}
	var s string
	for range r.IntN(12) + 1 {
		s += pieces[r.IntN(len(pieces))]
	}
	return s
}

func randAddrPort(r *rand.Rand) netip.AddrPort {
	switch r.IntN(5) {
	case 0:
		return netip.AddrPort{}
	case 1:
		var a [16]byte
		for i := range a {
			a[i] = byte(r.Uint32())
		}
		return netip.AddrPortFrom(netip.AddrFrom16(a), uint16(r.Uint32()))
	case 2:
		return netip.AddrPortFrom(netip.MustParseAddr("fe80::1").WithZone(randString(r)+"x"), 53)
	case 3:
		return netip.AddrPortFrom(netip.MustParseAddr("::ffff:10.0.0.1"), uint16(r.Uint32()))
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(r.Uint32()), byte(r.Uint32()), byte(r.Uint32())}), uint16(r.Uint32()))
}

func randFloat(r *rand.Rand) float64 {
	switch r.IntN(6) {
	case 0:
		return 0
	case 1:
		return r.Float64() * 1e-7 // exponent form
	case 2:
		return r.Float64() * 1e25 // exponent form past 1e21
	case 3:
		return -r.Float64() * 5000
	case 4:
		return math.Float64frombits(r.Uint64()&^(0x7ff<<52) | uint64(r.IntN(0x7fe)+1)<<52) // any finite
	}
	return float64(r.IntN(6000)) + 0.001*float64(r.IntN(1000))
}

func randQType(r *rand.Rand) QType {
	return []QType{0, 1, 28, 33, 65, 255, 65280, QType(r.Uint32())}[r.IntN(8)]
}

func randIncident(r *rand.Rand) *Incident {
	u32 := func() uint32 {
		if r.IntN(3) == 0 {
			return 0
		}
		return r.Uint32()
	}
	inc := &Incident{Type: randString(r), ID: r.Uint64(), Cause: randString(r), QName: randString(r), QType: randQType(r),
		NetNS: u32(), PID: u32(), Comm: randString(r), Cgroup: uint64(u32()) << r.IntN(32), Src: randAddrPort(r),
		Dst: randAddrPort(r), Retried: r.IntN(2) == 0, NodeNetNS: u32(), Tier: randString(r), Pod: randString(r),
		Namespace: randString(r), Container: randString(r)}
	inc.Time = time.Unix(int64(r.IntN(4e9)), int64(r.IntN(1e9))*int64(r.IntN(2))).In(
		[]*time.Location{time.UTC, time.FixedZone("x", 5*3600+1800), time.FixedZone("y", -7*3600)}[r.IntN(3)])
	if r.IntN(2) == 0 {
		s := randString(r)
		inc.Race = &s
	}
	if r.IntN(2) == 0 {
		f := randFloat(r)
		inc.StallMs = &f
	}
	if r.IntN(2) == 0 {
		inc.Retry = &Retry{QType: randQType(r), ID: uint16(r.Uint32()), Src: randAddrPort(r), Dst: randAddrPort(r)}
	}
	switch r.IntN(3) {
	case 0: // nil: null
	case 1:
		inc.Lost = []Packet{}
	default:
		for range r.IntN(3) + 1 {
			inc.Lost = append(inc.Lost, Packet{QType: randQType(r), ID: uint16(r.Uint32()), Cause: randString(r),
				Race: randString(r), Reason: randString(r), Location: randString(r), NetNS: u32(), CPU: uint16(r.Uint32())})
		}
	}
	if r.IntN(2) == 0 {
		inc.Sibling = &Sibling{QType: randQType(r), ID: uint16(r.Uint32()), GapUs: randFloat(r),
			CPUs: [2]int{r.IntN(512) - 1, r.IntN(512)}, Answered: r.IntN(2) == 0, Lost: r.IntN(2) == 0}
	}
	if r.IntN(2) == 0 {
		inc.Winner = &Flow{Src: randAddrPort(r), Dst: randAddrPort(r), ReplySrc: randAddrPort(r), ReplyDst: randAddrPort(r),
			NetNS: u32(), QName: randString(r), QType: randQType(r), Comm: randString(r), PID: u32()}
	}
	return inc
}

// TestAppendJSONMatchesEncodingJSON holds the hand-written encoder to the
// contract encoding/json defines for Incident's field tags: the same bytes
// for every field, empty and nil values, and every string that JSON
// escaping treats apart.
func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		inc := randIncident(r)
		want, err := json.Marshal(inc)
		if err != nil {
			t.Fatalf("case %d: encoding/json: %v", i, err)
		}
		if got := inc.AppendJSON(nil); !bytes.Equal(got, want) {
			t.Fatalf("case %d differs from encoding/json:\n got %s\nwant %s", i, got, want)
		}
	}
	// The zero incident too (nil pointers, nil slice, zero time).
	var zero Incident
	want, _ := json.Marshal(&zero)
	if got := zero.AppendJSON(nil); !bytes.Equal(got, want) {
		t.Fatalf("zero incident:\n got %s\nwant %s", got, want)
	}
}

// TestAppendJSONNonFinite: encoding/json refuses NaN and infinities (the
// line would be lost); the incident is written, with null there.
func TestAppendJSONNonFinite(t *testing.T) {
	nan := math.NaN()
	inc := &Incident{Type: "incident", StallMs: &nan, Sibling: &Sibling{GapUs: math.Inf(1)}}
	var obj struct {
		StallMs *float64 `json:"stall_ms"`
		Sibling struct {
			GapUs *float64 `json:"gap_us"`
		} `json:"sibling"`
	}
	if err := json.Unmarshal(inc.AppendJSON(nil), &obj); err != nil {
		t.Fatalf("not JSON: %v: %s", err, inc.AppendJSON(nil))
	}
	if obj.StallMs != nil || obj.Sibling.GapUs != nil {
		t.Fatalf("non-finite floats not null: %s", inc.AppendJSON(nil))
	}
}

// BenchmarkIncidentJSON compares the two encoders on an incident like those
// a flood of drops closes (one lost packet, no sibling or winner).
func BenchmarkIncidentJSON(b *testing.B) {
	inc := &Incident{Type: "incident", ID: 123456, Time: time.Unix(1764666698, 650013406).UTC(), Cause: CauseLocalDrop,
		QName: "q000bfbde.perf.test", QType: 1, NetNS: 4026532384, PID: 16321, Comm: "dnsrace", Cgroup: 1,
		Src: netip.MustParseAddrPort("127.0.0.1:38658"), Dst: netip.MustParseAddrPort("127.0.0.1:53"),
		NodeNetNS: 4026532384, Tier: "tracepoint", Lost: []Packet{{QType: 1, ID: 46686, Cause: CauseLocalDrop,
			Reason: "SOCKET_RCVBUFF", Location: "udp_queue_rcv_one_skb+0x437", NetNS: 4026532384}}}
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(inc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf = inc.AppendJSON(buf[:0])
		}
	})
}

// TestCloneSharesNothing: a clone reads the same, and stays so when
// everything the original points to is overwritten (as a reused stall
// overwrites its incident's).
func TestCloneSharesNothing(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 2000 {
		inc := randIncident(r)
		inc.Upstream = &Upstream{NetNS: r.Uint32(), SentMs: randFloat(r)}
		inc.StaleNAT = &StaleNAT{NetNS: r.Uint32(), Backends: []netip.AddrPort{randAddrPort(r)}, LastAnswerMs: new(float64)}
		inc.Downstream = []Asker{{Incident: r.Uint64()}}
		if len(inc.Lost) > 0 {
			inc.Lost[0].AnsweredMs = new(float64)
		}
		want := inc.AppendJSON(nil)
		c := inc.Clone()
		other := randIncident(r)
		if inc.Race != nil {
			*inc.Race = "overwritten"
		}
		for _, p := range []*float64{inc.StallMs, inc.StaleNAT.LastAnswerMs} {
			if p != nil {
				*p = -1
			}
		}
		if inc.Retry != nil {
			*inc.Retry = Retry{}
		}
		if inc.Sibling != nil {
			*inc.Sibling = Sibling{}
		}
		if inc.Winner != nil {
			*inc.Winner = Flow{}
		}
		*inc.Upstream = Upstream{}
		inc.StaleNAT.Backends[0] = netip.AddrPort{}
		*inc.StaleNAT = StaleNAT{}
		inc.Downstream[0] = Asker{}
		for j := range inc.Lost {
			if p := inc.Lost[j].AnsweredMs; p != nil {
				*p = -1
			}
			inc.Lost[j] = Packet{}
		}
		*inc = *other
		if got := c.AppendJSON(nil); !bytes.Equal(got, want) {
			t.Fatalf("case %d: the clone changed with its original:\n got %s\nwant %s", i, got, want)
		}
	}
}
