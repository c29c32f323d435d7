package doctor

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ResolvConf is a parsed resolv.conf(5), as glibc and musl read it.
type ResolvConf struct {
	Nameservers []netip.Addr
	// BadNameservers are nameserver lines the resolvers ignore.
	BadNameservers []string
	Search         []string
	Options        []ResolvOption
	// Comments are the comment lines, without the leading '#' or ';'.
	Comments []string
}

// ResolvOption is one word of an options line ("ndots:5" is ndots, "5").
type ResolvOption struct {
	Name  string
	Value string
}

// ParseResolvConf parses resolv.conf text. It fails only on input that is
// not a text file (NUL bytes, invalid UTF-8, a line longer than 4 KiB); the
// resolvers skip lines they do not understand, and so does this parser.
func ParseResolvConf(data []byte) (ResolvConf, error) {
	var rc ResolvConf
	if !utf8.Valid(data) {
		return rc, errors.New("parsing resolv.conf: not UTF-8 text")
	}
	if strings.IndexByte(string(data), 0) >= 0 {
		return rc, errors.New("parsing resolv.conf: contains NUL bytes")
	}
	for n, line := range strings.Split(string(data), "\n") {
		if len(line) > 4096 {
			return rc, fmt.Errorf("parsing resolv.conf: line %d is longer than 4096 bytes", n+1)
		}
		line = strings.TrimRight(line, "\r")
		if strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			rc.Comments = append(rc.Comments, strings.TrimSpace(line[1:]))
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "nameserver":
			if len(f) < 2 {
				rc.BadNameservers = append(rc.BadNameservers, line)
				continue
			}
			s := f[1]
			if i := strings.IndexByte(s, '%'); i >= 0 && !strings.Contains(s, ":") {
				s = s[:i]
			}
			a, err := netip.ParseAddr(s)
			if err != nil {
				rc.BadNameservers = append(rc.BadNameservers, line)
				continue
			}
			rc.Nameservers = append(rc.Nameservers, a)
		case "search", "domain":
			// The last search or domain line wins.
			rc.Search = append([]string(nil), f[1:]...)
		case "options":
			for _, w := range f[1:] {
				name, val, _ := strings.Cut(w, ":")
				if name == "" {
					continue
				}
				rc.Options = append(rc.Options, ResolvOption{Name: name, Value: val})
			}
		}
	}
	return rc, nil
}

// Has reports whether option name is set.
func (rc ResolvConf) Has(name string) bool {
	for _, o := range rc.Options {
		if o.Name == name {
			return true
		}
	}
	return false
}

// intOption returns the last value of a numeric option clamped to [0,max],
// or def when absent or unparsable.
func (rc ResolvConf) intOption(name string, def, max int) int {
	v := def
	for _, o := range rc.Options {
		if o.Name != name {
			continue
		}
		n, err := strconv.Atoi(o.Value)
		if err != nil || n < 0 {
			continue
		}
		v = min(n, max)
	}
	return v
}

// Ndots, Timeout (seconds) and Attempts with glibc's defaults and caps.
func (rc ResolvConf) Ndots() int    { return rc.intOption("ndots", 1, 15) }
func (rc ResolvConf) Timeout() int  { return rc.intOption("timeout", 5, 30) }
func (rc ResolvConf) Attempts() int { return rc.intOption("attempts", 2, 5) }

// OptionsString renders the options as they would appear on an options line.
func (rc ResolvConf) OptionsString() string {
	var ws []string
	for _, o := range rc.Options {
		if o.Value != "" {
			ws = append(ws, o.Name+":"+o.Value)
		} else {
			ws = append(ws, o.Name)
		}
	}
	return strings.Join(ws, " ")
}

// NameserverStrings returns the nameservers as text.
func (rc ResolvConf) NameserverStrings() []string {
	out := make([]string, len(rc.Nameservers))
	for i, a := range rc.Nameservers {
		out[i] = a.String()
	}
	return out
}

// commentMentions reports whether a comment line contains s (used for
// systemd-resolved's "No DNS servers known.").
func (rc ResolvConf) commentMentions(s string) bool {
	for _, c := range rc.Comments {
		if strings.Contains(c, s) {
			return true
		}
	}
	return false
}
