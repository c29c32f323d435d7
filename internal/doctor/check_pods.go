package doctor

import (
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// containerResolv is one container's resolver setup.
type containerResolv struct {
	PID  int
	Comm string
	Libc string // glibc, musl, none
	RC   ResolvConf
}

// libcOfExe reads the ELF interpreter of a process's executable
// (/proc/PID/exe): the most direct answer to "which resolver runs here".
// ok is false when the executable cannot be read (fixtures, races).
func libcOfExe(exe string) (libc string, ok bool) {
	f, err := os.Open(exe)
	if err != nil {
		return "", false
	}
	defer f.Close()
	return libcOfELF(f)
}

// libcOfELF reads the ELF interpreter of an executable: glibc, musl,
// "static" without one, "other (PATH)"; ok is false for what is not a
// readable ELF file.
func libcOfELF(r io.ReaderAt) (libc string, ok bool) {
	f, err := elf.NewFile(r)
	if err != nil {
		return "", false
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, min(p.Filesz, 256))
		if _, err := p.ReadAt(b, 0); err != nil {
			return "", false
		}
		interp := strings.TrimRight(string(b), "\x00")
		switch {
		case strings.Contains(interp, "ld-musl"):
			return "musl", true
		case strings.Contains(interp, "ld-linux"):
			return "glibc", true
		}
		return "other (" + interp + ")", true
	}
	return "static", true // no interpreter: a static binary, e.g. Go
}

// libcOf tells which C library a container's dynamic loader belongs to.
// A container without either (distroless static, scratch) most likely runs
// a Go or other self-contained resolver.
func libcOf(croot string) string {
	glob := func(p string) bool {
		real, _, err := resolveIn(croot, filepath.Dir(p))
		if err != nil {
			return false
		}
		m, _ := filepath.Glob(filepath.Join(real, filepath.Base(p)))
		return len(m) > 0
	}
	switch {
	case glob("/lib/ld-musl-*.so.1"):
		return "musl"
	case glob("/lib64/ld-linux-*.so.*"), glob("/lib/ld-linux*.so.*"),
		glob("/lib/x86_64-linux-gnu/ld-linux-*.so.*"), glob("/lib/aarch64-linux-gnu/ld-linux-*.so.*"),
		glob("/usr/lib64/ld-linux-*.so.*"):
		return "glibc"
	}
	return "none"
}

// listContainers finds processes whose mount namespace differs from PID
// 1's, one per mount namespace, and reads their resolv.conf.
func (e *env) listContainers(probs *problems) ([]containerResolv, int) {
	ents, err := os.ReadDir(e.hostPath("/proc"))
	if err != nil {
		probs.addf("listing /proc: %v", unwrapPathErr(err))
		return nil, 0
	}
	// The host's mount namespace: PID 1's, or doctor's own where PID 1's is
	// hidden (sandboxes). Fixture trees have neither, and then every
	// process with a root/etc/resolv.conf counts as a container.
	initMnt, err := os.Readlink(e.hostPath("/proc/1/ns/mnt"))
	if err != nil && e.Root == "/" {
		initMnt, _ = os.Readlink("/proc/self/ns/mnt")
	}
	seenNS := map[string]bool{}
	var out []containerResolv
	unreadable := 0
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == 1 {
			continue
		}
		base := fmt.Sprintf("/proc/%d", pid)
		mnt, merr := os.Readlink(e.hostPath(base + "/ns/mnt"))
		if merr != nil && initMnt != "" {
			continue // a kernel thread (no mm, no ns links) or gone
		}
		if merr == nil {
			if mnt == initMnt || seenNS[mnt] {
				continue
			}
			seenNS[mnt] = true
		}
		// The kernel follows /proc/PID/root itself; below it, links are
		// resolved within the container's root.
		croot := e.hostPath(base + "/root")
		data, _, err := readIn(croot, "/etc/resolv.conf")
		if err != nil {
			if os.IsNotExist(err) || strings.Contains(err.Error(), "no such file") {
				continue // kernel threads, or a container without resolv.conf
			}
			unreadable++
			if unreadable <= 3 {
				probs.addf("pid %d: %v", pid, err)
			}
			continue
		}
		rc, err := ParseResolvConf(data)
		if err != nil {
			unreadable++
			if unreadable <= 3 {
				probs.addf("pid %d /etc/resolv.conf: %v", pid, err)
			}
			continue
		}
		comm, _ := e.sysfsString(base + "/comm")
		libc, ok := libcOfExe(e.hostPath(base + "/exe"))
		if !ok {
			libc = libcOf(croot)
		}
		out = append(out, containerResolv{PID: pid, Comm: comm, Libc: libc, RC: rc})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out, unreadable
}

// checkPods: what do the running containers' resolvers do with A and AAAA?
// glibc and musl send both from one socket at once (the racing pair);
// single-request(-reopen) and use-vc avoid it on glibc but musl ignores
// them, which hides nothing on Alpine images (seed 002).
func checkPods(_ context.Context, e *env) Result {
	var probs problems
	cs, unreadable := e.listContainers(&probs)
	if len(cs) == 0 {
		reason := "no container processes found under /proc (on `kubectl debug node`, the pod needs hostPID)"
		if len(probs) > 0 {
			reason = strings.Join(probs, "; ")
		}
		return Result{Verdict: Skip, Reason: reason}
	}
	type group struct {
		key     string
		members []containerResolv
	}
	groups := map[string]*group{}
	var order []string
	for _, c := range cs {
		key := c.Libc + "|" + strings.Join(c.RC.NameserverStrings(), ",") + "|" + c.RC.OptionsString()
		g := groups[key]
		if g == nil {
			g = &group{key: key}
			groups[key] = g
			order = append(order, key)
		}
		g.members = append(g.members, c)
	}
	sort.SliceStable(order, func(i, j int) bool { return len(groups[order[i]].members) > len(groups[order[j]].members) })

	var r Result
	r.Verdict = OK
	var issues []string
	exposed, mitigated := 0, 0
	const maxGroups = 12
	for gi, key := range order {
		g := groups[key]
		c := g.members[0]
		rc := c.RC
		var notes []string
		sr := rc.Has("single-request") || rc.Has("single-request-reopen")
		vc := rc.Has("use-vc") || rc.Has("usevc") || rc.Has("tcp")
		nodeLocal := len(rc.Nameservers) > 0 && rc.Nameservers[0].String() == nodeLocalIP
		switch {
		case len(rc.Nameservers) == 0:
			r.Verdict = worst(r.Verdict, Warn)
			issues = append(issues, fmt.Sprintf("%d container(s) without a nameserver", len(g.members)))
			notes = append(notes, "no nameserver: every lookup fails")
		case c.Libc == "musl" && (sr || vc):
			r.Verdict = worst(r.Verdict, Warn)
			var ignored []string
			for _, o := range []string{"single-request", "single-request-reopen", "use-vc", "usevc", "tcp"} {
				if rc.Has(o) {
					ignored = append(ignored, o)
				}
			}
			issues = append(issues, fmt.Sprintf("%d musl container(s) rely on %s, which musl ignores", len(g.members), strings.Join(ignored, " ")))
			notes = append(notes, fmt.Sprintf("musl ignores %s: A and AAAA still race on one socket, a lost one is resent after %.1fs",
				strings.Join(ignored, " "), float64(rc.Timeout())/float64(max(rc.Attempts(), 1))))
			exposed += len(g.members)
		case nodeLocal:
			notes = append(notes, "NodeLocal DNSCache: no DNAT, no conntrack race")
		case c.Libc == "glibc" && vc:
			notes = append(notes, "use-vc: TCP only, no UDP race")
			mitigated += len(g.members)
		case c.Libc == "glibc" && sr:
			notes = append(notes, "single-request(-reopen): A and AAAA sequential, the race is hidden (counters still show other losses)")
			mitigated += len(g.members)
		case c.Libc == "glibc":
			notes = append(notes, "glibc: A+AAAA in one sendmmsg on one socket (same 5-tuple): exposed to the conntrack race")
			exposed += len(g.members)
		case c.Libc == "musl":
			notes = append(notes, fmt.Sprintf("musl: A+AAAA on one socket to every server: exposed; a lost query is resent after %.1fs",
				float64(rc.Timeout())/float64(max(rc.Attempts(), 1))))
			exposed += len(g.members)
		default:
			notes = append(notes, "no libc loader (static binary, likely Go: new socket per query, no same-tuple race)")
		}
		if rc.Ndots() >= 5 && len(rc.Search) > 0 {
			notes = append(notes, fmt.Sprintf("ndots:%d with %d search domains: an external name costs up to %d lookups, each one a chance to lose %ds",
				rc.Ndots(), len(rc.Search), len(rc.Search)+1, rc.Timeout()))
		}
		if rc.Timeout()*rc.Attempts() > 30 {
			notes = append(notes, fmt.Sprintf("timeout:%d attempts:%d: a dead server stalls a lookup %ds", rc.Timeout(), rc.Attempts(), rc.Timeout()*rc.Attempts()))
		}
		if gi >= maxGroups {
			continue
		}
		var ex []string
		for i, m := range g.members {
			if i == 3 {
				ex = append(ex, fmt.Sprintf("+%d more", len(g.members)-3))
				break
			}
			ex = append(ex, fmt.Sprintf("pid %d (%s)", m.PID, m.Comm))
		}
		opts := rc.OptionsString()
		if opts == "" {
			opts = "(no options)"
		}
		r.Evidence = append(r.Evidence, fmt.Sprintf("%d container(s), %s, nameserver %s, options %s: %s; e.g. %s",
			len(g.members), c.Libc, strings.Join(rc.NameserverStrings(), ","), opts, strings.Join(notes, "; "), strings.Join(ex, ", ")))
	}
	if len(order) > maxGroups {
		r.Evidence = append(r.Evidence, fmt.Sprintf("... %d more groups", len(order)-maxGroups))
	}
	if unreadable > 0 {
		r.Evidence = append(r.Evidence, fmt.Sprintf("%d container(s) with an unreadable resolv.conf", unreadable))
	}
	if len(issues) > 0 {
		r.Summary = strings.Join(issues, "; ")
		r.Fix = "give the pods a nameserver (dnsPolicy/dnsConfig); musl images: use NodeLocal DNSCache or a kernel that " +
			"resolves the race (kernel-fix) instead of single-request-reopen, or rebuild on a glibc base"
	} else {
		r.Summary = fmt.Sprintf("%d container(s) in %d resolver group(s): %d exposed to the same-socket A/AAAA race, %d mitigated",
			len(cs), len(order), exposed, mitigated)
	}
	// Containers whose resolv.conf could not be read do not turn a clean
	// result into a skip: the ones read are a real answer. Only a result
	// built from nothing would be a false ok, and that returned early.
	if r.Verdict != OK {
		return probs.finish(r)
	}
	for _, p := range probs {
		r.Evidence = append(r.Evidence, "could not read: "+p)
	}
	return r
}
