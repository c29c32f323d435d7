package event

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// Raw record layouts: struct rec_query, rec_answer and rec_event in
// bpf/dnsrace.h, little endian (the byte order of both BPF targets, amd64
// and arm64). decode_test.go checks these offsets against the
// bpf2go-generated types, so a layout change there that these do not
// follow fails the tests.
const (
	// RawDNSCap is how many bytes of a DNS message a record can hold.
	RawDNSCap = 272
	// HdrSize, QuerySize, AnswerSize and EventSize are the fixed parts
	// of the records; Query and Event records are followed by dns_len
	// bytes of the DNS message.
	HdrSize    = 24
	QuerySize  = 96
	AnswerSize = 32
	EventSize  = 280

	// An event with no DNS message may end before its winner's entry
	// (when it has none: no FlagWinner) or before its own entry (when
	// it has none either); see event_size in bpf/lib/record.h.
	EventNoWinnerSize = offEWinner
	EventNoCTSize     = offECT

	offTS    = 0
	offQID   = 8
	offNetNS = 16
	offCPU   = 20
	offType  = 22
	offTier  = 23

	offQCgroup = 24
	offQPID    = 32
	offQDNSLen = 36
	offQFlags  = 38
	offQComm   = 40
	offQTuple  = 56

	offADNSFlags = 24

	offELocation  = 24
	offEWinnerQID = 32
	offEReason    = 40
	offEDNSLen    = 44
	offEKind      = 46
	offEFlags     = 47
	offEPkt       = 48
	offECT        = 88
	offEWinner    = 184

	// struct tuple
	tupleSize = 40
	tupSaddr  = 0
	tupDaddr  = 16
	tupSport  = 32
	tupDport  = 34
	tupFamily = 36
	tupProto  = 37
	// struct ct
	ctSize      = 96
	ctPtr       = 0
	ctStatus    = 8
	ctOrig      = 16
	ctReply     = 16 + tupleSize
	dnsHeaderSz = 12

	recQuery  = 1
	recAnswer = 2
	recEvent  = 3
)

// Errors Decode returns. They are values, so a failed decode does not
// allocate either.
var (
	ErrShortRecord = errors.New("event: record shorter than its type's fixed part")
	ErrBadKind     = errors.New("event: record has an unknown type or kind")
	ErrBadLength   = errors.New("event: record's DNS length exceeds the record")
)

var le = binary.LittleEndian

// Decode fills e from one raw ring buffer record (struct rec_query,
// rec_answer or rec_event of bpf/dnsrace.h). It overwrites every field of
// e, keeps no reference to raw and does not allocate, so a reader can reuse
// one Event for every record. An event record without a DNS message may
// stop before the entries it does not carry (EventNoWinnerSize,
// EventNoCTSize); they decode as zero.
//
// Tuples are invalid (zero) when the kernel side had no address family for
// them. DNS is decoded from the captured start of the message: DNS.Valid is
// set when the 12-byte header was captured and the first question name is
// well formed as far as it was captured (no compression pointers or
// reserved label types, at most 255 wire bytes); the name is kept whole as
// sent, as far as captured (NameKey, Name: Name.Cut reports a capture that
// ended inside it) and shown in dotted form when asked for (QName,
// NameBytes), bytes outside printable ASCII and dots inside a label as '?';
// NameTruncated is set when the dotted form was cut at MaxName or the
// capture ended inside the name; QType is 0 when it was not captured.
func Decode(raw []byte, e *Event) error {
	e.reset()
	if len(raw) < HdrSize {
		return ErrShortRecord
	}
	e.TimeNs = le.Uint64(raw[offTS:])
	e.QID = le.Uint64(raw[offQID:])
	e.NetNS = le.Uint32(raw[offNetNS:])
	e.CPU = le.Uint16(raw[offCPU:])
	e.Tier = Tier(raw[offTier])
	switch raw[offType] {
	case recQuery:
		if len(raw) < QuerySize {
			return ErrShortRecord
		}
		e.Kind = KindQuery
		e.Cgroup = le.Uint64(raw[offQCgroup:])
		e.PID = le.Uint32(raw[offQPID:])
		e.Flags = raw[offQFlags]
		copy(e.Comm[:], raw[offQComm:offQComm+16])
		decodeTuple(raw[offQTuple:offQTuple+tupleSize], &e.Packet)
		return decodeTail(raw, QuerySize, int(le.Uint16(raw[offQDNSLen:])), &e.DNS)
	case recAnswer:
		if len(raw) < AnswerSize {
			return ErrShortRecord
		}
		e.Kind = KindAnswer
		e.Flags = FlagResponse
		flags := le.Uint16(raw[offADNSFlags:])
		e.DNS.Response = flags&0x8000 != 0
		e.DNS.Rcode = uint8(flags & 0xf)
		return nil
	case recEvent:
		if len(raw) < EventNoCTSize {
			return ErrShortRecord
		}
		k := raw[offEKind]
		if k == 0 || int(k)+int(KindDrop)-1 >= int(kindMax) {
			return ErrBadKind
		}
		e.Kind = Kind(k) + KindDrop - 1
		e.Flags = raw[offEFlags]
		e.Location = le.Uint64(raw[offELocation:])
		e.WinnerQID = le.Uint64(raw[offEWinnerQID:])
		e.Reason = le.Uint32(raw[offEReason:])
		decodeTuple(raw[offEPkt:offEPkt+tupleSize], &e.Packet)
		switch n := le.Uint16(raw[offEDNSLen:]); {
		case len(raw) >= EventSize:
			decodeCT(raw[offECT:offECT+ctSize], &e.CT)
			decodeCT(raw[offEWinner:offEWinner+ctSize], &e.Winner)
			return decodeTail(raw, EventSize, int(n), &e.DNS)
		case n != 0 || e.Flags&FlagWinner != 0:
			return ErrShortRecord
		case len(raw) == EventNoWinnerSize:
			decodeCT(raw[offECT:offECT+ctSize], &e.CT)
		case len(raw) != EventNoCTSize:
			return ErrShortRecord
		}
		return nil
	}
	e.Kind = KindInvalid
	return ErrBadKind
}

// decodeTail decodes the n bytes of DNS message after a record's fixed
// part.
func decodeTail(raw []byte, fixed, n int, d *DNS) error {
	if n > RawDNSCap || fixed+n > len(raw) {
		return ErrBadLength
	}
	decodeDNS(raw[fixed:fixed+n], d)
	return nil
}

// decodeTuple fills t (zero) in place: a Tuple built on the stack and
// copied out was read back before its stores had landed, and the stalled
// load was a fifth of a query record's decode.
func decodeTuple(b []byte, t *Tuple) {
	switch b[tupFamily] {
	case 4:
		t.Src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[tupSaddr:tupSaddr+4])), le.Uint16(b[tupSport:]))
		t.Dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[tupDaddr:tupDaddr+4])), le.Uint16(b[tupDport:]))
	case 6:
		t.Src = netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[tupSaddr:tupSaddr+16])), le.Uint16(b[tupSport:]))
		t.Dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[tupDaddr:tupDaddr+16])), le.Uint16(b[tupDport:]))
	default:
		return
	}
	t.Proto = b[tupProto]
}

func decodeCT(b []byte, c *CT) {
	c.Ptr = le.Uint64(b[ctPtr:])
	if c.Ptr == 0 {
		return
	}
	c.Status = le.Uint32(b[ctStatus:])
	decodeTuple(b[ctOrig:ctOrig+tupleSize], &c.Orig)
	decodeTuple(b[ctReply:ctReply+tupleSize], &c.Reply)
}

// decodeDNS parses the header and first question of a captured DNS
// message prefix into d (reset: every field zero but the name's buffers).
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

	// Walk the labels by their length bytes only, to where the name ends.
	// The bytes are copied as they are (the root label too, when traced:
	// Name); show converts them if the name is asked for.
	off, end, whole := dnsHeaderSz, 0, false
	for {
		if off >= len(b) { // the capture ended at or inside this label
			end, d.NameTruncated, d.Valid = len(b), true, true
			break
		}
		l := int(b[off])
		if l == 0 {
			end, d.Valid, whole = off, true, true
			off++
			break
		}
		// A compression pointer or reserved label type, or a name past
		// 255 wire bytes: not valid.
		if l&0xc0 != 0 || off+1+l-dnsHeaderSz > maxWire {
			end = off
			break
		}
		off += 1 + l
	}
	// The dotted form is a byte shorter than the labels: each length byte
	// but the first is a dot (or, cut inside a label, the bytes it has).
	n := max(end-dnsHeaderSz-1, 0)
	if n > MaxName {
		n, d.NameTruncated = MaxName, true
	}
	d.NameLen = uint8(n)
	// The walk keeps end-dnsHeaderSz <= maxWire: the labels fit, and so
	// does the root label of a whole name after them.
	d.wireLen, d.whole = uint8(copy(d.wire[:], b[dnsHeaderSz:end])), whole
	d.wire[d.wireLen] = 0
	if whole && off+2 <= len(b) {
		d.QType = binary.BigEndian.Uint16(b[off:])
	}
}

// show puts the dotted form of the wire name in d.name. (Decode has set
// NameLen and NameTruncated: the dotted form's length and whether it is
// cut at MaxName.)
func (d *DNS) show() {
	d.shown = true
	showName(&d.name, d.wire[:d.wireLen])
}

// showName puts the dotted form of the labels w (a name's wire form, as far
// as traced) in dst, as much as fits, and returns its length.
func showName[S ~string | ~[]byte](dst *[MaxName]byte, w S) int {
	n := 0
	for off := 0; off < len(w) && n < MaxName; {
		l := int(w[off])
		if l == 0 { // the root label
			break
		}
		off++
		end := min(off+l, len(w))
		if n > 0 {
			dst[n] = '.'
			n++
		}
		n = putLabel(dst, n, w[off:end])
		off = end
	}
	return n
}

// putLabel puts a label's bytes at n in dst, as many as fit, each outside
// printable ASCII or a dot shown as '?'. One bounds check per label, not
// per byte, and no branch per byte: the loop was most of Decode's
// instructions.
func putLabel[S ~string | ~[]byte](dst *[MaxName]byte, n int, label S) int {
	d := dst[n:]
	if len(label) > len(d) {
		label = label[:len(d)]
	}
	d = d[:len(label)]
	for i := range len(label) {
		d[i] = shown[label[i]]
	}
	return n + len(label)
}

// shown maps a label's byte to how the name shows it: a table load per
// byte instead of three compares and a branch.
var shown = func() (t [256]byte) {
	for c := range t {
		if c <= ' ' || c >= 0x7f || c == '.' {
			t[c] = '?'
		} else {
			t[c] = byte(c)
		}
	}
	return t
}()
