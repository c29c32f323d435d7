package main

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzByteSize: --output-max-size takes a size or refuses it; a size it
// takes is never negative, is the number times its suffix's power of 1024
// exactly (no overflow), and prints back as a size that reads the same.
func FuzzByteSize(f *testing.F) {
	for _, s := range []string{"4096", "512K", "100M", "1G", "2mb", "0", "-1", "12Q", "M", "", "8589934591G", "9223372036854775807", "9223372036854775807K"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var b byteSize
		if err := b.Set(s); err != nil {
			return
		}
		if b < 0 {
			t.Fatalf("%q: size %d", s, b)
		}
		mult := int64(1)
		switch u := strings.TrimSuffix(strings.ToUpper(s), "B"); {
		case strings.HasSuffix(u, "K"):
			mult = 1 << 10
		case strings.HasSuffix(u, "M"):
			mult = 1 << 20
		case strings.HasSuffix(u, "G"):
			mult = 1 << 30
		}
		if int64(b)%mult != 0 {
			t.Fatalf("%q: %d is no multiple of %d", s, b, mult)
		}
		n := strings.TrimRight(strings.ToUpper(s), "KMGB")
		if v, err := strconv.ParseInt(n, 10, 64); err == nil && v != int64(b)/mult {
			t.Fatalf("%q: %d / %d != %d (overflow)", s, b, mult, v)
		}
		var again byteSize
		if err := again.Set(b.String()); err != nil || again != b {
			t.Fatalf("%q -> %q -> %d, %v", s, b.String(), again, err)
		}
	})
}
