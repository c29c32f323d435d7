package overhead

import (
	"bytes"
	"fmt"
	"strings"
)

// projectFrame marks a frame of dnsrace's own code in a Go traceback.
const projectFrame = "github.com/dnsrace/dnsrace/"

// hungStacks reads the traceback a Go process prints at SIGQUIT and keeps
// what says where it hangs: the goroutines with a frame of dnsrace's own
// code, each summed up on one line (its number, state and top frame, and
// its innermost dnsrace frame), then those goroutines' stacks in full,
// capped at limit bytes. The summary comes last: a CI log shows a failed
// test's last lines, and the runtime's own goroutines, first in the dump,
// used to fill them.
func hungStacks(dump []byte, limit int) string {
	var summary, stacks []string
	for _, g := range bytes.Split(dump, []byte("\n\n")) {
		lines := strings.Split(strings.TrimSpace(string(g)), "\n")
		if len(lines) < 2 || !strings.HasPrefix(lines[0], "goroutine ") || !bytes.Contains(g, []byte(projectFrame)) {
			continue
		}
		// A frame is its function's line then its file's, indented; a
		// line the runtime adds ("...additional frames elided...") has
		// no file after it, so frames are found by prefix, not by pairs.
		own := ""
		for i := 1; i < len(lines); i++ {
			if strings.HasPrefix(lines[i], projectFrame) {
				own = frameFunc(lines[i])
				if i+1 < len(lines) {
					if f := strings.Fields(lines[i+1]); len(f) > 0 {
						own += " at " + f[0]
					}
				}
				break
			}
		}
		summary = append(summary, fmt.Sprintf("%s %s <- %s", goroutineHead(lines[0]), frameFunc(lines[1]), own))
		stacks = append(stacks, strings.Join(lines, "\n"))
	}
	if len(summary) == 0 {
		// No goroutine of ours: the dump's start (the signal, the
		// running thread) is what there is.
		if len(dump) > limit {
			dump = dump[:limit]
		}
		return string(dump)
	}
	full := strings.Join(stacks, "\n\n")
	if len(full) > limit {
		full = full[:limit] + "\n…"
	}
	return full + "\n\nwhere dnsrace's goroutines were:\n" + strings.Join(summary, "\n")
}

// goroutineHead is "goroutine N [state]" of a header line such as
// "goroutine 1 gp=0x… m=nil [chan receive, 2 minutes]:".
func goroutineHead(line string) string {
	f := strings.Fields(line)
	state := ""
	if i, j := strings.Index(line, "["), strings.LastIndex(line, "]"); i >= 0 && j > i {
		state = line[i : j+1]
	}
	if len(f) < 2 {
		return line
	}
	return f[0] + " " + f[1] + " " + state
}

// frameFunc is a frame's function without its arguments.
func frameFunc(line string) string {
	if i := strings.LastIndex(line, "("); i > 0 {
		return line[:i]
	}
	return line
}
