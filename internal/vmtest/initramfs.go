package vmtest

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// The guest's initramfs is three newc archives, concatenated (the kernel
// unpacks them in turn): the base (busybox, /init, /etc, glibc's getent),
// the kernel's modules (cached per kernel and module list), and the run's
// test binaries with test2json and dnsrace.

//go:embed init.sh
var guestInit []byte

var etcFiles = map[string]string{
	"etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n",
	"etc/hosts":         "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	"etc/resolv.conf":   "nameserver 127.0.0.1\n",
	"etc/passwd":        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
	"etc/group":         "root:x:0:\nnogroup:x:65534:\n",
	"etc/protocols":     "ip 0 IP\nicmp 1 ICMP\ntcp 6 TCP\nudp 17 UDP\nipv6-icmp 58 IPv6-ICMP\n",
	"etc/services":      "domain 53/tcp\ndomain 53/udp\n",
}

// Userland is where a guest's busybox and glibc come from.
type Userland struct {
	Busybox string            // a static busybox
	Files   map[string]string // guest path -> host file: getent, its loader and libraries
}

// HostUserland takes busybox and getent (with its NSS and resolver
// libraries, so the lab can drive a real glibc stub resolver) from the host,
// and dnsmasq with its libraries where the host has it (the lab's
// node-local cache scenarios).
func HostUserland(ctx context.Context) (*Userland, error) {
	u := &Userland{Busybox: "/bin/busybox", Files: map[string]string{}}
	if out, _ := os.ReadFile(u.Busybox); strings.Contains(string(out[:min(len(out), 8192)]), "ld-linux") || len(out) == 0 {
		return nil, fmt.Errorf("%s is not a static busybox (apt-get install busybox-static)", u.Busybox)
	}
	getent := "/usr/bin/getent"
	if _, err := os.Stat(getent); err != nil {
		return u, nil
	}
	multi := "/lib/x86_64-linux-gnu/"
	for _, f := range []string{getent, multi + "libnss_dns.so.2", multi + "libnss_files.so.2", multi + "libresolv.so.2", "/usr/sbin/dnsmasq"} {
		if _, err := os.Stat(f); err != nil {
			continue
		}
		u.Files[f] = f
		out, _ := exec.CommandContext(ctx, "ldd", f).Output()
		for _, lib := range regexp.MustCompile(`/\S+`).FindAllString(string(out), -1) {
			u.Files[lib] = lib
		}
	}
	return u, nil
}

// ForeignUserland takes busybox-static, libc-bin (getent) and libc6 of
// another architecture from Debian, unpacked once under dir.
func ForeignUserland(ctx context.Context, apt *Apt, dir string) (*Userland, error) {
	pkgs, err := apt.Candidates(ctx, "busybox-static", "libc-bin", "libc6")
	if err != nil {
		return nil, err
	}
	roots := map[string]string{}
	for _, p := range pkgs {
		d := filepath.Join(dir, p.Name+"_"+p.Version)
		root := filepath.Join(d, "root")
		if _, err := os.Stat(filepath.Join(d, ".unpacked")); err != nil {
			deb, err := apt.Download(ctx, d, p)
			if err != nil {
				return nil, err
			}
			if err := dpkgExtract(ctx, deb, root); err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(d, ".unpacked"), nil, 0o644); err != nil {
				return nil, err
			}
		}
		roots[p.Name] = root
	}
	for _, n := range []string{"busybox-static", "libc-bin", "libc6"} {
		if roots[n] == "" {
			return nil, fmt.Errorf("apt (%s, %s) has no %s for the guest's userland", apt.Codename, apt.Arch, n)
		}
	}
	u := &Userland{Busybox: filepath.Join(roots["busybox-static"], "bin", "busybox"), Files: map[string]string{}}
	u.Files["/usr/bin/getent"] = filepath.Join(roots["libc-bin"], "usr", "bin", "getent")
	// bookworm's libc6 has its libraries in lib/<triple>, later ones in usr/lib/<triple>
	var libdirs []string
	for _, d := range []string{"lib", "usr/lib"} {
		m, _ := filepath.Glob(filepath.Join(roots["libc6"], d, "*-linux-gnu"))
		libdirs = append(libdirs, m...)
	}
	if len(libdirs) == 0 {
		return nil, fmt.Errorf("libc6 (%s) has no lib/<triple>", apt.Arch)
	}
	triple := filepath.Base(libdirs[0])
	find := func(name string) string {
		for _, d := range libdirs {
			if _, err := os.Stat(filepath.Join(d, name)); err == nil {
				return filepath.Join(d, name)
			}
		}
		return filepath.Join(libdirs[0], name) // missing: the archive's error names it
	}
	for _, l := range []string{"libc.so.6", "libnss_dns.so.2", "libnss_files.so.2", "libresolv.so.2"} {
		u.Files["/lib/"+triple+"/"+l] = find(l)
	}
	// the program interpreter arm64 binaries name (PT_INTERP): /lib/ld-linux-aarch64.so.1
	for _, d := range libdirs {
		lds, _ := filepath.Glob(filepath.Join(d, "ld-linux-*.so.*"))
		for _, l := range lds {
			u.Files["/lib/"+triple+"/"+filepath.Base(l)] = l
			u.Files["/lib/"+filepath.Base(l)] = l
		}
	}
	return u, nil
}

// WriteBase writes the base archive.
func WriteBase(file string, u *Userland) error {
	return writeCpio(file, func(c *cpioWriter) {
		for _, d := range []string{"sbin", "usr/sbin", "proc", "sys", "dev", "run", "tmp", "root", "var", "vmtest", "lib/modules"} {
			c.Dir(d)
		}
		c.Copy("bin/busybox", u.Busybox)
		c.Symlink("bin/sh", "busybox")
		for dst, src := range u.Files {
			c.Copy(dst, src)
		}
		c.File("init", 0o755, guestInit)
		for name, text := range etcFiles {
			c.File(name, 0o644, []byte(text))
		}
	})
}

// ModulesArchive writes (once per kernel, label and module list) the
// archive of the kernel's modules, decompressed, with /vmtest/modules (the
// load order) and /vmtest/kernel (the label); it returns its path.
func ModulesArchive(ctx context.Context, kb *KernelBuild, label string, roots []string, log func(string, ...any)) (string, error) {
	key := sha256.Sum256([]byte(fmt.Sprintf("format=2 label=%s roots=%q", label, roots)))
	file := filepath.Join(kb.Dir, fmt.Sprintf("modules-%x.cpio", key[:6]))
	if _, err := os.Stat(file); err == nil {
		return file, nil
	}
	mods, err := kb.Modules(ctx, roots, log)
	if err != nil {
		return "", err
	}
	var order []string
	err = writeCpio(file, func(c *cpioWriter) {
		for _, m := range mods {
			base, data, err := decompressModule(ctx, m)
			if err != nil {
				c.err = err
				return
			}
			c.File("lib/modules/vmtest/"+base, 0o644, data)
			order = append(order, base)
		}
		c.File("vmtest/modules", 0o644, []byte(strings.Join(order, "\n")+"\n"))
		c.File("vmtest/kernel", 0o644, []byte(label+"\n"))
	})
	if err == nil {
		log("%s: %d modules: %s", label, len(order), strings.Join(order, " "))
	}
	return file, err
}

// GuestFiles is what the suites archive of an architecture carries.
type GuestFiles struct {
	Suites      []Suite
	Test2json   string
	Dnsrace     string // "" for none
	TestTimeout int    // seconds, -test.timeout
	Env         []string
}

// WriteSuites writes the suites archive.
func WriteSuites(file string, gf GuestFiles) error {
	seen := map[string]bool{}
	var lines strings.Builder
	for _, s := range gf.Suites {
		if seen[s.Name] {
			return fmt.Errorf("two suites named %s for %s", s.Name, s.Arch)
		}
		seen[s.Name] = true
		fmt.Fprintf(&lines, "%s %s %s\n", s.Name, s.Pattern, strings.Join(s.Tiers, ","))
	}
	return writeCpio(file, func(c *cpioWriter) {
		for _, s := range gf.Suites {
			dir := "vmtest/suites.d/" + s.Name
			c.Copy(dir+"/"+s.Name+".test", s.Binary)
			if s.Testdata != "" {
				c.Tree(dir+"/testdata", s.Testdata)
			}
		}
		c.File("vmtest/suites", 0o644, []byte(lines.String()))
		c.File("vmtest/test-timeout", 0o644, []byte(fmt.Sprintf("%d\n", gf.TestTimeout)))
		env := strings.Join(gf.Env, "\n")
		if env != "" {
			env += "\n"
		}
		c.File("vmtest/env", 0o644, []byte(env))
		c.Copy("usr/bin/test2json", gf.Test2json)
		if gf.Dnsrace != "" {
			c.Copy("usr/bin/dnsrace", gf.Dnsrace)
		}
	})
}

// ElfArch is a binary's architecture from its ELF header: amd64, arm64, or
// an error.
func ElfArch(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	hdr := make([]byte, 20)
	if _, err := f.ReadAt(hdr, 0); err != nil || string(hdr[:4]) != "\x7fELF" {
		return "", fmt.Errorf("%s is not an ELF file", file)
	}
	switch uint16(hdr[18]) | uint16(hdr[19])<<8 {
	case 0x3e:
		return "amd64", nil
	case 0xb7:
		return "arm64", nil
	}
	return "", fmt.Errorf("%s is neither an amd64 nor an arm64 binary", file)
}

// concat writes the files one after the other into out.
func concat(out string, files ...string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	for _, in := range files {
		data, err := os.ReadFile(in)
		if err == nil {
			_, err = f.Write(data)
		}
		if err != nil {
			f.Close()
			return fmt.Errorf("writing %s: %w", out, err)
		}
	}
	return f.Close()
}
