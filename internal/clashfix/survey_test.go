package clashfix

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestAssessAgreesWithSurveys holds the kernel table to what the lab
// measured: every survey file under docs/survey (dnsrace lab survey, on the
// host and on Debian's kernels in the VM harness) is a kernel's own answer
// for the classes its scenarios race, and Assess, given that kernel's
// release alone, must say the same.
//
//   - same-tuple and local-out: A and AAAA from one socket, DNAT to two
//     backends at random (in local-out, in the sender's own namespace):
//     SameTupleDiffDNAT. Resolved: races rescued (clash_resolve > 0) and
//     none dropped (insert_failed = 0); else dropped.
//   - snat-port, target-port, local-out-snat: flows given the same SNAT
//     reply tuple: SNATReplyClash, dropped on every kernel.
func TestAssessAgreesWithSurveys(t *testing.T) {
	files, err := filepath.Glob("../../docs/survey/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no survey files under docs/survey (%v)", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var s struct {
				Kernel    string `json:"kernel"`
				Scenarios []struct {
					Name         string `json:"name"`
					InsertFailed uint64 `json:"insert_failed"`
					ClashResolve uint64 `json:"clash_resolve"`
				} `json:"scenarios"`
			}
			if err := json.Unmarshal(b, &s); err != nil {
				t.Fatal(err)
			}
			var f Facts
			if err := f.SetRelease(s.Kernel); err != nil {
				t.Fatalf("kernel %q: %v", s.Kernel, err)
			}
			a := Assess(f)
			checked := 0
			for _, sc := range s.Scenarios {
				var c Class
				switch sc.Name {
				case "same-tuple", "local-out":
					c = SameTupleDiffDNAT
				case "snat-port", "target-port", "local-out-snat":
					c = SNATReplyClash
				default:
					continue
				}
				checked++
				resolved := sc.InsertFailed == 0 && sc.ClashResolve > 0
				dropped := sc.InsertFailed > 0
				if r := a.Class(c); r.Resolved && !resolved || !r.Resolved && !dropped {
					t.Errorf("%s on %s: measured insert_failed %d, clash_resolve %d; the table says %s: resolved %v (%s)",
						sc.Name, s.Kernel, sc.InsertFailed, sc.ClashResolve, c, r.Resolved, r.Basis)
				}
			}
			if checked == 0 {
				t.Errorf("%s: no scenario of a class the table knows", file)
			}
		})
	}
}
