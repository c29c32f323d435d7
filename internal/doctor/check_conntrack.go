package doctor

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// ctSnap is one namespace's conntrack counters, from ctnetlink (live) or
// /proc/net/stat/nf_conntrack (files).
type ctSnap struct {
	ctstats.Snapshot
	HaveMax bool
	Source  string
}

// readCTLive reads netnsPath's counters over ctnetlink ("" = doctor's own).
func readCTLive(netnsPath string) (ctSnap, error) {
	var s ctstats.Snapshot
	err := withTimeout(liveTimeout, "reading conntrack statistics over ctnetlink", func() (err error) {
		s, err = ctstats.Read(netnsPath)
		return err
	})
	if err != nil {
		return ctSnap{}, err
	}
	return ctSnap{Snapshot: s, HaveMax: s.Max > 0, Source: "ctnetlink"}, nil
}

// readCTProcInNetNS reads a namespace's counters from procfs, from a
// thread inside it: /proc/thread-self/net and /proc/sys/net follow the
// reading thread's namespace. The fallback when ctnetlink is unavailable.
func readCTProcInNetNS(netnsPath string) (ctSnap, error) {
	var s ctSnap
	var probs problems
	err := nsutil.DoPath(netnsPath, func() (err error) {
		live := &env{Config: Config{Root: "/"}}
		s, err = live.readCTFilesAt("/proc/thread-self/net/stat/nf_conntrack", &probs)
		return err
	})
	if err == nil && len(probs) > 0 {
		s.HaveMax = false
	}
	return s, err
}

// readCTFiles reads the host namespace's counters from procfs under root.
func (e *env) readCTFiles(probs *problems) (ctSnap, error) {
	return e.readCTFilesAt("/proc/net/stat/nf_conntrack", probs)
}

func (e *env) readCTFilesAt(statPath string, probs *problems) (ctSnap, error) {
	data, _, err := e.read(statPath)
	if err != nil {
		return ctSnap{}, err
	}
	snap, err := parseCTStat(data)
	if err != nil {
		return ctSnap{}, fmt.Errorf("parsing %s: %w", statPath, err)
	}
	s := ctSnap{Snapshot: snap, Source: statPath}
	// The stat file's entries column is the count; the sysctl agrees.
	if v, err := e.readUint("/proc/sys/net/netfilter/nf_conntrack_count"); err == nil {
		s.Entries = uint32(v)
	}
	if v, err := e.readUint("/proc/sys/net/netfilter/nf_conntrack_max"); err == nil {
		s.Max, s.HaveMax = uint32(v), true
	} else {
		probs.addf("table fill unknown: %v", err)
	}
	return s, nil
}

func (e *env) readUint(p string) (uint64, error) {
	b, _, err := e.read(p)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing %s: %w", p, err)
	}
	return v, nil
}

// parseCTStat parses /proc/net/stat/nf_conntrack: a header of column names,
// then one line of hex values per possible CPU (docs/kernel.md §5). Columns are
// found by name, so the pre-5.10 ("searched") and pre-5.15 ("delete_list")
// layouts parse too; their meaningless columns are ignored.
func parseCTStat(data []byte) (ctstats.Snapshot, error) {
	var s ctstats.Snapshot
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	if !sc.Scan() {
		return s, fmt.Errorf("empty file")
	}
	cols := strings.Fields(sc.Text())
	idx := map[string]int{}
	for i, c := range cols {
		idx[c] = i
	}
	for _, need := range []string{"entries", "insert_failed", "drop"} {
		if _, ok := idx[need]; !ok {
			return s, fmt.Errorf("header has no %q column: %q", need, sc.Text())
		}
	}
	line := 1
	for sc.Scan() {
		line++
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) != len(cols) {
			return s, fmt.Errorf("line %d has %d fields, header has %d", line, len(f), len(cols))
		}
		vals := make([]uint64, len(f))
		for i, x := range f {
			v, err := strconv.ParseUint(x, 16, 64)
			if err != nil {
				return s, fmt.Errorf("line %d: %q is not hex", line, x)
			}
			vals[i] = v
		}
		get := func(name string) uint64 {
			if i, ok := idx[name]; ok {
				return vals[i]
			}
			return 0
		}
		c := ctstats.Counters{
			Found:         get("found"),
			Invalid:       get("invalid"),
			Insert:        get("insert"),
			InsertFailed:  get("insert_failed"),
			Drop:          get("drop"),
			EarlyDrop:     get("early_drop"),
			Error:         get("icmp_error"),
			SearchRestart: get("search_restart"),
			ClashResolve:  get("clashres"),
			ChainTooLong:  get("chainlength"),
		}
		s.Entries = uint32(get("entries"))
		s.PerCPU = append(s.PerCPU, c)
		s.Total.Add(c)
	}
	if err := sc.Err(); err != nil {
		return s, err
	}
	if len(s.PerCPU) == 0 {
		return s, fmt.Errorf("no per-CPU lines")
	}
	return s, nil
}

// nonZero renders the counters that matter for DNS loss, non-zero only.
func nonZero(c ctstats.Counters) string {
	var parts []string
	for _, kv := range []struct {
		k string
		v uint64
	}{
		{"insert_failed", c.InsertFailed}, {"drop", c.Drop}, {"early_drop", c.EarlyDrop},
		{"chaintoolong", c.ChainTooLong}, {"clash_resolve", c.ClashResolve}, {"insert", c.Insert},
	} {
		if kv.v != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", kv.k, kv.v))
		}
	}
	if len(parts) == 0 {
		return "all zero"
	}
	return strings.Join(parts, " ")
}

// checkConntrack: has conntrack lost insertions (insert_failed, drop),
// evicted entries (early_drop) or filled up, in the host namespace and in
// every --netns namespace? The counters are cumulative since the namespace
// was created; clash_resolve counts races the kernel resolved without loss.
func checkConntrack(_ context.Context, e *env) Result {
	type ns struct{ label, path string }
	targets := []ns{{"host", ""}}
	for _, p := range e.NetNS {
		targets = append(targets, ns{p, p})
	}
	var r Result
	var probs problems
	r.Verdict = OK
	var bad []string
	read := 0
	for _, t := range targets {
		var s ctSnap
		var err error
		switch {
		case e.Live:
			s, err = readCTLive(t.path)
			if err != nil {
				// Without ctnetlink (no CAP_NET_ADMIN, no module),
				// procfs may still answer.
				var fs ctSnap
				var ferr error
				if t.path == "" {
					fs, ferr = e.readCTFiles(&probs)
				} else {
					fs, ferr = readCTProcInNetNS(t.path)
				}
				if ferr == nil {
					r.Evidence = append(r.Evidence, fmt.Sprintf("%s: ctnetlink failed (%v), read procfs instead", t.label, err))
					s, err = fs, nil
				}
			}
		case t.path == "":
			s, err = e.readCTFiles(&probs)
		default:
			err = fmt.Errorf("reading %s needs --live (netlink)", t.path)
		}
		if err != nil {
			probs.addf("%s: %v", t.label, err)
			continue
		}
		read++
		tot := s.Total
		fill := ""
		if s.HaveMax && s.Max > 0 {
			pct := float64(s.Entries) * 100 / float64(s.Max)
			fill = fmt.Sprintf("%d/%d entries (%.0f%%)", s.Entries, s.Max, pct)
			switch {
			case pct >= 90:
				r.Verdict = worst(r.Verdict, Fail)
				bad = append(bad, fmt.Sprintf("%s table %.0f%% full", t.label, pct))
			case pct >= 75:
				r.Verdict = worst(r.Verdict, Warn)
				bad = append(bad, fmt.Sprintf("%s table %.0f%% full", t.label, pct))
			}
		} else {
			fill = fmt.Sprintf("%d entries (max unknown)", s.Entries)
		}
		r.Evidence = append(r.Evidence, fmt.Sprintf("%s (%s): %s; %s", t.label, s.Source, fill, nonZero(tot)))
		for cpu, c := range s.PerCPU {
			if c.InsertFailed|c.Drop|c.EarlyDrop|c.ClashResolve|c.ChainTooLong != 0 {
				r.Evidence = append(r.Evidence, fmt.Sprintf("%s cpu%d: %s", t.label, cpu, nonZero(ctstatsLossView(c))))
			}
		}
		var lost []string
		if tot.InsertFailed > 0 {
			lost = append(lost, fmt.Sprintf("insert_failed=%d", tot.InsertFailed))
		}
		if tot.Drop > 0 {
			lost = append(lost, fmt.Sprintf("drop=%d", tot.Drop))
		}
		if tot.EarlyDrop > 0 {
			lost = append(lost, fmt.Sprintf("early_drop=%d", tot.EarlyDrop))
		}
		if tot.ChainTooLong > 0 {
			lost = append(lost, fmt.Sprintf("chaintoolong=%d", tot.ChainTooLong))
		}
		if len(lost) > 0 {
			r.Verdict = worst(r.Verdict, Warn)
			bad = append(bad, t.label+" "+strings.Join(lost, " "))
		}
	}
	switch {
	case read == 0:
		return Result{Verdict: Skip, Reason: strings.Join(probs, "; "), Evidence: r.Evidence}
	case len(bad) > 0:
		r.Summary = strings.Join(bad, "; ") + " (cumulative)"
		r.Fix = "run `dnsrace trace` to attribute each loss to a race class; insert_failed with drop is an unresolved clash " +
			"(see kernel-fix and kube-proxy for which classes this node still drops); early_drop or a full table: raise " +
			"net.netfilter.nf_conntrack_max or cut UDP entries (NodeLocal DNSCache)"
	default:
		r.Summary = fmt.Sprintf("no conntrack insertion losses in %d namespace(s)", read)
	}
	return probs.finish(r)
}

// ctstatsLossView keeps only the counters worth showing per CPU.
func ctstatsLossView(c ctstats.Counters) ctstats.Counters {
	return ctstats.Counters{InsertFailed: c.InsertFailed, Drop: c.Drop, EarlyDrop: c.EarlyDrop,
		ClashResolve: c.ClashResolve, ChainTooLong: c.ChainTooLong}
}
