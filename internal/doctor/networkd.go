package doctor

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// networkdDirs are systemd-networkd's .network search paths, highest
// priority first: a file in an earlier directory hides one of the same name
// in a later one.
var networkdDirs = []string{
	"/etc/systemd/network",
	"/run/systemd/network",
	"/usr/local/lib/systemd/network",
	"/usr/lib/systemd/network",
	"/lib/systemd/network",
}

// networkFile is the part of a .network file (plus its drop-ins) that
// decides whether and how networkd manages a link.
type networkFile struct {
	Path string // node path
	// Names are the [Match] Name= globs; Negate is set for "Name=!...".
	Names  []string
	Negate bool
	// OtherMatch lists other [Match] keys, which doctor cannot evaluate
	// from files alone (MACAddress=, Driver=, Type=, ...).
	OtherMatch []string
	Unmanaged  bool
	DHCP       string
	Masked     bool // a link to /dev/null
}

// loadNetworkd reads the effective .network files in the order networkd
// applies them (by file name). Unreadable files are reported in probs.
func (e *env) loadNetworkd(probs *problems) []networkFile {
	seen := map[string]bool{}
	var files []networkFile
	for _, dir := range networkdDirs {
		ents, err := os.ReadDir(e.hostPath(dir))
		if err != nil {
			if !os.IsNotExist(err) {
				probs.addf("%s: %v", dir, unwrapPathErr(err))
			}
			continue
		}
		for _, ent := range ents {
			name := ent.Name()
			if !strings.HasSuffix(name, ".network") || seen[name] {
				continue
			}
			seen[name] = true
			p := path.Join(dir, name)
			nf := networkFile{Path: p}
			if t, err := os.Readlink(e.hostPath(p)); err == nil && t == "/dev/null" {
				nf.Masked = true
				files = append(files, nf)
				continue
			}
			if err := e.parseNetworkFile(p, &nf); err != nil {
				probs.addf("%v", err)
				continue
			}
			// Drop-ins: NAME.network.d/*.conf in any search dir.
			for _, ddir := range networkdDirs {
				dd := path.Join(ddir, name+".d")
				confs, _ := filepath.Glob(filepath.Join(e.hostPath(dd), "*.conf"))
				sort.Strings(confs)
				for _, c := range confs {
					if err := e.parseNetworkFile(path.Join(dd, filepath.Base(c)), &nf); err != nil {
						probs.addf("%v", err)
					}
				}
			}
			files = append(files, nf)
		}
	}
	sort.SliceStable(files, func(i, j int) bool { return path.Base(files[i].Path) < path.Base(files[j].Path) })
	return files
}

func (e *env) parseNetworkFile(p string, nf *networkFile) error {
	data, _, err := e.read(p)
	if err != nil {
		return err
	}
	return parseNetworkData(p, data, nf)
}

// parseNetworkData adds the [Match], [Link] and [Network] keys doctor needs
// from one .network file or drop-in (named p in errors) to nf.
func parseNetworkData(p string, data []byte, nf *networkFile) error {
	section := ""
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			if !strings.HasSuffix(line, "]") {
				return fmt.Errorf("parsing %s: bad section line %q", p, line)
			}
			section = line[1 : len(line)-1]
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return fmt.Errorf("parsing %s: line %q is not KEY=VALUE", p, line)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch section {
		case "Match":
			switch k {
			case "Name":
				if v == "" {
					nf.Names, nf.Negate = nil, false
					continue
				}
				if strings.HasPrefix(v, "!") {
					nf.Negate = true
					v = strings.TrimSpace(v[1:])
				}
				nf.Names = append(nf.Names, strings.Fields(v)...)
			default:
				nf.OtherMatch = append(nf.OtherMatch, k+"="+v)
			}
		case "Link":
			if k == "Unmanaged" {
				nf.Unmanaged = parseBool(v)
			}
		case "Network":
			if k == "DHCP" {
				nf.DHCP = v
			}
		}
	}
	return sc.Err()
}

func parseBool(v string) bool {
	switch strings.ToLower(v) {
	case "1", "yes", "true", "on":
		return true
	}
	return false
}

// matchesName reports whether the file's Name= globs select ifname. A file
// with no Name= matches every link (as far as Name goes).
func (nf networkFile) matchesName(ifname string) bool {
	if len(nf.Names) == 0 {
		return true
	}
	hit := false
	for _, g := range nf.Names {
		if ok, _ := path.Match(g, ifname); ok {
			hit = true
			break
		}
	}
	return hit != nf.Negate
}

// networkFor returns the .network file networkd would apply to ifname (the
// first by name whose [Match] selects it), or nil.
func networkFor(files []networkFile, ifname string) *networkFile {
	for i := range files {
		if files[i].Masked {
			continue
		}
		if files[i].matchesName(ifname) {
			return &files[i]
		}
	}
	return nil
}

func (nf *networkFile) describe() string {
	var parts []string
	if len(nf.Names) > 0 {
		neg := ""
		if nf.Negate {
			neg = "!"
		}
		parts = append(parts, "Name="+neg+strings.Join(nf.Names, " "))
	} else {
		parts = append(parts, "no Name= (matches any link)")
	}
	parts = append(parts, nf.OtherMatch...)
	if nf.Unmanaged {
		parts = append(parts, "Unmanaged=true")
	}
	if nf.DHCP != "" {
		parts = append(parts, "DHCP="+nf.DHCP)
	}
	return nf.Path + " [" + strings.Join(parts, ", ") + "]"
}
