package correlate

import (
	"encoding/json"
	"math"
	"net/netip"
	"strconv"
	"time"
	"unicode/utf8"
)

// This file writes an Incident as JSON by hand, byte for byte what
// encoding/json writes for it (TestAppendJSONMatchesEncodingJSON holds it
// to that): a flood of drops closes tens of thousands of incidents a
// second, and encoding/json would pay for reflection on every one.

// AppendJSON appends inc as one JSON object (no newline), as
// json.Marshal(inc) would, HTML characters escaped as there. A NaN or
// infinite float, which json.Marshal refuses, is written as null.
func (inc *Incident) AppendJSON(b []byte) []byte {
	b = appendStr(b, `{"type":`, inc.Type)
	b = appendNum(b, `,"id":`, inc.ID)
	b = append(b, `,"time":"`...)
	b = inc.Time.AppendFormat(b, time.RFC3339Nano)
	b = appendStr(b, `","cause":`, inc.Cause)
	b = append(b, `,"race":`...)
	if inc.Race == nil {
		b = append(b, "null"...)
	} else {
		b = appendString(b, *inc.Race)
	}
	b = appendStr(b, `,"qname":`, inc.QName)
	b = appendStr(b, `,"qtype":`, inc.QType.String())
	b = appendNum(b, `,"netns":`, uint64(inc.NetNS))
	b = appendNonZero(b, `,"pid":`, uint64(inc.PID))
	b = appendNonEmpty(b, `,"comm":`, inc.Comm)
	b = appendNonZero(b, `,"cgroup":`, inc.Cgroup)
	b = appendAddr(b, `,"src":`, inc.Src)
	b = appendAddr(b, `,"dst":`, inc.Dst)
	b = append(b, `,"stall_ms":`...)
	if inc.StallMs == nil {
		b = append(b, "null"...)
	} else {
		b = appendFloat(b, *inc.StallMs)
	}
	if inc.StallAtLeast {
		b = append(b, `,"stall_at_least":true`...)
	}
	b = append(b, `,"retried":`...)
	b = strconv.AppendBool(b, inc.Retried)
	b = appendObject(b, `,"retry":`, inc.Retry, (*Retry).appendJSON)
	b = appendNonZero(b, `,"node_netns":`, uint64(inc.NodeNetNS))
	b = append(b, `,"lost":`...)
	if inc.Lost == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range inc.Lost {
			if i > 0 {
				b = append(b, ',')
			}
			b = inc.Lost[i].appendJSON(b)
		}
		b = append(b, ']')
	}
	b = appendObject(b, `,"sibling":`, inc.Sibling, (*Sibling).appendJSON)
	b = appendObject(b, `,"winner":`, inc.Winner, (*Flow).appendJSON)
	b = appendStr(b, `,"tier":`, inc.Tier)
	b = appendNonEmpty(b, `,"pod":`, inc.Pod)
	b = appendNonEmpty(b, `,"namespace":`, inc.Namespace)
	b = appendNonEmpty(b, `,"container":`, inc.Container)
	if inc.RefusedAtSend {
		b = append(b, `,"refused_at_send":true`...)
	}
	// Rare, and a few per incident at most: encoding/json's own.
	if inc.StaleNAT != nil {
		b = appendMarshal(b, `,"stale_nat":`, inc.StaleNAT)
	}
	if inc.Upstream != nil {
		b = appendMarshal(b, `,"upstream":`, inc.Upstream)
	}
	if len(inc.Downstream) > 0 {
		b = appendMarshal(b, `,"downstream":`, inc.Downstream)
	}
	b = appendNonZero(b, `,"downstream_more":`, uint64(inc.DownstreamMore))
	return append(b, '}')
}

// appendMarshal writes key and v as json.Marshal writes it (null if it
// cannot, which the types written here never do).
func appendMarshal(b []byte, key string, v any) []byte {
	b = append(b, key...)
	j, err := json.Marshal(v)
	if err != nil {
		return append(b, "null"...)
	}
	return append(b, j...)
}

func (r *Retry) appendJSON(b []byte) []byte {
	b = appendStr(b, `{"qtype":`, r.QType.String())
	b = appendNum(b, `,"id":`, uint64(r.ID))
	b = appendAddr(b, `,"src":`, r.Src)
	b = appendAddr(b, `,"dst":`, r.Dst)
	return append(b, '}')
}

func (s *Sibling) appendJSON(b []byte) []byte {
	b = appendStr(b, `{"qtype":`, s.QType.String())
	b = appendNum(b, `,"id":`, uint64(s.ID))
	b = append(b, `,"gap_us":`...)
	b = appendFloat(b, s.GapUs)
	b = append(b, `,"cpus":[`...)
	b = strconv.AppendInt(b, int64(s.CPUs[0]), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(s.CPUs[1]), 10)
	b = append(b, `],"answered":`...)
	b = strconv.AppendBool(b, s.Answered)
	b = append(b, `,"lost":`...)
	b = strconv.AppendBool(b, s.Lost)
	return append(b, '}')
}

func (p *Packet) appendJSON(b []byte) []byte {
	b = appendStr(b, `{"qtype":`, p.QType.String())
	b = appendNum(b, `,"id":`, uint64(p.ID))
	b = appendStr(b, `,"cause":`, p.Cause)
	b = appendNonEmpty(b, `,"race":`, p.Race)
	b = appendNonEmpty(b, `,"reason":`, p.Reason)
	b = appendNonEmpty(b, `,"location":`, p.Location)
	b = appendNonZero(b, `,"netns":`, uint64(p.NetNS))
	b = appendNum(b, `,"cpu":`, uint64(p.CPU))
	if p.SendFailed {
		b = append(b, `,"send_failed":true`...)
	}
	if p.AnsweredMs != nil {
		b = append(b, `,"answered_ms":`...)
		b = appendFloat(b, *p.AnsweredMs)
	}
	return append(b, '}')
}

func (f *Flow) appendJSON(b []byte) []byte {
	b = appendAddr(b, `{"src":`, f.Src)
	b = appendAddr(b, `,"dst":`, f.Dst)
	if f.ReplySrc != (netip.AddrPort{}) { // omitzero
		b = appendAddr(b, `,"reply_src":`, f.ReplySrc)
	}
	if f.ReplyDst != (netip.AddrPort{}) {
		b = appendAddr(b, `,"reply_dst":`, f.ReplyDst)
	}
	b = appendNonZero(b, `,"netns":`, uint64(f.NetNS))
	b = appendNonEmpty(b, `,"qname":`, f.QName)
	if f.QType != 0 {
		b = appendStr(b, `,"qtype":`, f.QType.String())
	}
	b = appendNonEmpty(b, `,"comm":`, f.Comm)
	b = appendNonZero(b, `,"pid":`, uint64(f.PID))
	return append(b, '}')
}

// The field writers: key is the JSON text before the value (`,"id":`).

// appendObject writes key, then v as its appendJSON writes it, or null.
func appendObject[T any](b []byte, key string, v *T, write func(*T, []byte) []byte) []byte {
	b = append(b, key...)
	if v == nil {
		return append(b, "null"...)
	}
	return write(v, b)
}

func appendNum(b []byte, key string, v uint64) []byte {
	return strconv.AppendUint(append(b, key...), v, 10)
}

// appendNonZero writes a number field tagged omitempty.
func appendNonZero(b []byte, key string, v uint64) []byte {
	if v == 0 {
		return b
	}
	return appendNum(b, key, v)
}

func appendStr(b []byte, key, s string) []byte {
	return appendString(append(b, key...), s)
}

// appendNonEmpty writes a string field tagged omitempty.
func appendNonEmpty(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	return appendStr(b, key, s)
}

func appendAddr(b []byte, key string, p netip.AddrPort) []byte {
	return appendAddrPort(append(b, key...), p)
}

// appendAddrPort writes p as its MarshalText does ("" when zero), quoted:
// an IPv6 zone is arbitrary text, so it goes through appendString.
func appendAddrPort(b []byte, p netip.AddrPort) []byte {
	var buf [64]byte
	t, _ := p.AppendText(buf[:0])
	return appendString(b, string(t))
}

// appendFloat writes f as encoding/json does: the shortest decimal that
// reads back as f, in exponent form only below 1e-6 or from 1e21 on.
func appendFloat(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, "null"...)
	}
	format := byte('f')
	if a := math.Abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// 1e-07 -> 1e-7, as encoding/json trims it
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

const hexDigits = "0123456789abcdef"

// appendString writes s as a JSON string the way encoding/json does with
// HTML escaping on (its default): quotes, backslashes and control
// characters escaped, <, > and & as \u003c and so on, invalid UTF-8 as
// \ufffd, and U+2028 and U+2029 escaped (JavaScript line terminators).
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	done := 0 // s[:done] is written
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[done:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			done = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[done:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[done:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		done = i
	}
	b = append(b, s[done:]...)
	return append(b, '"')
}
