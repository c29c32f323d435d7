package kconfig

import (
	"bufio"
	"compress/gzip"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Release is the running kernel's release (uname -r), the one Lookup's
// /boot/config-<release> names; "" when uname fails.
func Release() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// Opener opens a path of the kernel's tree: os.Open, or one that reads
// inside another root.
type Opener func(path string) (*os.File, error)

// Lookup returns the value of a CONFIG_ option ("y", "m", a string, "n"
// when it is not set or absent) and the file it was read from, trying
// /proc/config.gz, then /boot/config-<release>, then
// /usr/lib/modules/<release>/config (both skipped when release is ""). Both are "" when neither file can be read.
func Lookup(open Opener, release, opt string) (value, where string) {
	try := func(p string, gz bool) (string, bool) {
		fh, err := open(p)
		if err != nil {
			return "", false
		}
		defer fh.Close()
		var rd io.Reader = fh
		if gz {
			z, err := gzip.NewReader(fh)
			if err != nil {
				return "", false
			}
			defer z.Close()
			rd = z
		}
		return Value(rd, opt)
	}
	if v, ok := try("/proc/config.gz", true); ok {
		return v, "/proc/config.gz"
	}
	if release != "" {
		// Debian ships Linux 7 without /boot: the config is beside the
		// modules.
		for _, p := range []string{"/boot/config-" + release, "/usr/lib/modules/" + release + "/config"} {
			if v, ok := try(p, false); ok {
				return v, p
			}
		}
	}
	return "", ""
}

// Value finds opt in kernel config text: its value ("y", "m", a string),
// "n" when it is "not set" or absent; ok is false when the text could not
// be read to its end.
func Value(r io.Reader, opt string) (string, bool) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, opt+"=") {
			return strings.TrimPrefix(l, opt+"="), true
		}
		if l == "# "+opt+" is not set" {
			return "n", true
		}
	}
	return "n", sc.Err() == nil
}
