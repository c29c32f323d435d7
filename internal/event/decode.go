package event

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// Raw record layout: struct event in bpf/dnsrace.h, little endian (the byte
// order of both BPF targets, amd64 and arm64). decode_test.go builds records
// from the bpf2go-generated type, so a layout change there that these
// offsets do not follow fails the tests.
const (
	// RawSize is the size of one ring buffer record.
	RawSize = 592
	// RawDNSCap is how many bytes of the DNS message a record can hold.
	RawDNSCap = 272

	offTS       = 0
	offSkb      = 8
	offCgroup   = 16
	offLocation = 24
	offCTAfter  = 32
	offNetNS    = 40
	offIfindex  = 44
	offPID      = 48
	offReason   = 52
	offVerdict  = 56
	offCPU      = 60
	offKind     = 62
	offTier     = 63
	offComm     = 64
	offPkt      = 80
	offCT       = 120
	offWinner   = 216
	offDNSLen   = 312
	offDNS      = 314

	// struct tuple
	tupleSize   = 40
	tupSaddr    = 0
	tupDaddr    = 16
	tupSport    = 32
	tupDport    = 34
	tupFamily   = 36
	tupProto    = 37
	ctPtr       = 0
	ctStatus    = 8
	ctOrig      = 16
	ctReply     = 16 + tupleSize
	dnsHeaderSz = 12
)

// Errors Decode returns. They are values, so a failed decode does not
// allocate either.
var (
	ErrShortRecord = errors.New("event: record shorter than the raw event")
	ErrBadKind     = errors.New("event: record has an unknown kind")
)

var le = binary.LittleEndian

// Decode fills e from one raw ring buffer record (struct event of
// bpf/dnsrace.h). It overwrites every field of e, keeps no reference to raw
// and does not allocate, so a reader can reuse one Event for every record.
//
// Packet, CT and Winner tuples are invalid (zero) when the kernel side had
// no address family for them. DNS is decoded from the captured start of the
// message: DNS.Valid is set when the 12-byte header was captured and the
// first question name is well formed as far as it was captured (no
// compression pointers or reserved label types, at most 255 wire bytes);
// the name is converted to dotted form, bytes outside printable ASCII and
// dots inside a label are shown as '?'; NameTruncated is set when the name
// was cut at MaxName or the capture ended inside it; QType is 0 when it was
// not captured.
func Decode(raw []byte, e *Event) error {
	if len(raw) < RawSize {
		*e = Event{}
		return ErrShortRecord
	}
	raw = raw[:RawSize]
	kind := Kind(raw[offKind])
	if kind == KindInvalid || kind >= kindMax {
		*e = Event{}
		return ErrBadKind
	}

	*e = Event{
		Kind:     kind,
		Tier:     Tier(raw[offTier]),
		TimeNs:   le.Uint64(raw[offTS:]),
		CPU:      le.Uint16(raw[offCPU:]),
		NetNS:    le.Uint32(raw[offNetNS:]),
		Ifindex:  le.Uint32(raw[offIfindex:]),
		PID:      le.Uint32(raw[offPID:]),
		Cgroup:   le.Uint64(raw[offCgroup:]),
		Skb:      le.Uint64(raw[offSkb:]),
		CTAfter:  le.Uint64(raw[offCTAfter:]),
		Verdict:  int32(le.Uint32(raw[offVerdict:])),
		Reason:   le.Uint32(raw[offReason:]),
		Location: le.Uint64(raw[offLocation:]),
	}
	copy(e.Comm[:], raw[offComm:offComm+16])
	e.Packet = decodeTuple(raw[offPkt : offPkt+tupleSize])
	decodeCT(raw[offCT:offCT+16+2*tupleSize], &e.CT)
	decodeCT(raw[offWinner:offWinner+16+2*tupleSize], &e.Winner)

	n := int(le.Uint16(raw[offDNSLen:]))
	if n > RawDNSCap {
		n = RawDNSCap
	}
	decodeDNS(raw[offDNS:offDNS+n], &e.DNS)
	return nil
}

func decodeTuple(b []byte) Tuple {
	var t Tuple
	var src, dst netip.Addr
	switch b[tupFamily] {
	case 4:
		src = netip.AddrFrom4([4]byte(b[tupSaddr : tupSaddr+4]))
		dst = netip.AddrFrom4([4]byte(b[tupDaddr : tupDaddr+4]))
	case 6:
		src = netip.AddrFrom16([16]byte(b[tupSaddr : tupSaddr+16]))
		dst = netip.AddrFrom16([16]byte(b[tupDaddr : tupDaddr+16]))
	default:
		return t
	}
	t.Src = netip.AddrPortFrom(src, le.Uint16(b[tupSport:]))
	t.Dst = netip.AddrPortFrom(dst, le.Uint16(b[tupDport:]))
	t.Proto = b[tupProto]
	return t
}

func decodeCT(b []byte, c *CT) {
	c.Ptr = le.Uint64(b[ctPtr:])
	if c.Ptr == 0 {
		return
	}
	c.Status = le.Uint32(b[ctStatus:])
	c.Orig = decodeTuple(b[ctOrig : ctOrig+tupleSize])
	c.Reply = decodeTuple(b[ctReply : ctReply+tupleSize])
}

// decodeDNS parses the header and first question of a captured DNS
// message prefix into d (which the caller has zeroed).
func decodeDNS(b []byte, d *DNS) {
	if len(b) < dnsHeaderSz {
		return
	}
	d.ID = binary.BigEndian.Uint16(b[0:])
	flags := binary.BigEndian.Uint16(b[2:])
	d.Response = flags&0x8000 != 0
	d.Rcode = uint8(flags & 0xf)
	if binary.BigEndian.Uint16(b[4:]) == 0 { // QDCOUNT
		d.Valid = true
		return
	}

	off, n, wire := dnsHeaderSz, 0, 0
	for {
		if off >= len(b) {
			d.NameLen, d.NameTruncated, d.Valid = uint8(n), true, true
			return
		}
		l := int(b[off])
		off++
		wire++
		if l == 0 {
			break
		}
		if l&0xc0 != 0 { // compression pointer or reserved label type
			d.NameLen = uint8(n)
			return
		}
		wire += l
		if wire > 255 {
			d.NameLen = uint8(n)
			return
		}
		if n > 0 {
			n = d.put(n, '.')
		}
		end := off + l
		cut := end > len(b)
		if cut {
			end = len(b)
		}
		for _, c := range b[off:end] {
			if c <= ' ' || c >= 0x7f || c == '.' {
				c = '?'
			}
			n = d.put(n, c)
		}
		if cut {
			d.NameLen, d.NameTruncated, d.Valid = uint8(n), true, true
			return
		}
		off = end
	}
	d.NameLen = uint8(n)
	d.Valid = true
	if off+2 <= len(b) {
		d.QType = binary.BigEndian.Uint16(b[off:])
	}
}

// put appends c at n unless the name is full, which it records.
func (d *DNS) put(n int, c byte) int {
	if n >= MaxName {
		d.NameTruncated = true
		return n
	}
	d.name[n] = c
	return n + 1
}
