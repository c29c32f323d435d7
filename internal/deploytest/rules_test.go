package deploytest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/metrics"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

const (
	rulesPath     = "../../scripts/prometheus-rules.yaml"
	rulesTestPath = "../../scripts/prometheus-rules.test.yaml"
	promDocPath   = "../../docs/prometheus.md"
	runbookPrefix = "https://github.com/dnsrace/dnsrace/blob/main/docs/prometheus.md#"
)

type rule struct {
	Record      string            `json:"record"`
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

func loadRules(t *testing.T) (ruleFile, []rule) {
	t.Helper()
	b, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("decoding %s strictly: %v", rulesPath, err)
	}
	var all []rule
	for _, g := range f.Groups {
		all = append(all, g.Rules...)
	}
	if len(all) == 0 {
		t.Fatal("no rules")
	}
	return f, all
}

// githubAnchors are the anchors GitHub gives the headings of a Markdown
// file: lower case, punctuation but '-' and '_' dropped, spaces to '-', and
// "-1", "-2" ... after a heading's second and later namesakes.
func githubAnchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fence := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimLeft(line, " "), "```") {
			fence = !fence
		}
		level := len(line) - len(strings.TrimLeft(line, "#"))
		if fence || level == 0 || level > 6 || !strings.HasPrefix(line[level:], " ") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(line[level:]))
		var b strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			seen[a]++
			a = fmt.Sprintf("%s-%d", a, n)
		} else {
			seen[a] = 1
		}
		out[a] = true
	}
	return out
}

// TestAlertAnnotations: every alert says what is wrong and where its
// runbook is, and that runbook is a heading of docs/prometheus.md.
func TestAlertAnnotations(t *testing.T) {
	_, rules := loadRules(t)
	doc, err := os.ReadFile(promDocPath)
	if err != nil {
		t.Fatal(err)
	}
	anchors := githubAnchors(string(doc))
	alerts := 0
	for _, r := range rules {
		if r.Alert == "" {
			continue
		}
		alerts++
		for _, k := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(r.Annotations[k]) == "" {
				t.Errorf("%s: no %s", r.Alert, k)
			}
		}
		if r.Labels["severity"] == "" {
			t.Errorf("%s: no severity label", r.Alert)
		}
		u := r.Annotations["runbook_url"]
		anchor, ok := strings.CutPrefix(u, runbookPrefix)
		if !ok || !anchors[anchor] {
			t.Errorf("%s: runbook_url %s is not a heading of %s (anchors %v)", r.Alert, u, promDocPath, anchors)
		}
	}
	if alerts < 3 {
		t.Errorf("%d alerts", alerts)
	}
}

func TestGithubAnchors(t *testing.T) {
	a := githubAnchors("# dnsrace\n```\n# not a heading\n```\n#### `DnsraceTracerDown`\n### Metrics (`--metrics-addr ADDR`)\n" +
		"## Usage\n## Usage\n#include <x.h>\n  ```\n## indented fence\n  ```\n")
	for _, want := range []string{"dnsrace", "dnsracetracerdown", "metrics---metrics-addr-addr", "usage", "usage-1"} {
		if !a[want] {
			t.Errorf("no anchor %q in %v", want, a)
		}
	}
	for _, not := range []string{"not-a-heading", "indented-fence", "include-xh"} {
		if a[not] {
			t.Errorf("%q became a heading: %v", not, a)
		}
	}
}

// TestRulesTested: the promtool file fires every alert at least once and
// holds it silent at least once, and checks every recording rule.
func TestRulesTested(t *testing.T) {
	_, rules := loadRules(t)
	b, err := os.ReadFile(rulesTestPath)
	if err != nil {
		t.Fatal(err)
	}
	var tf struct {
		RuleFiles []string `json:"rule_files"`
		Tests     []struct {
			AlertRuleTest []struct {
				Alertname string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
			PromqlExprTest []struct {
				Expr string `json:"expr"`
			} `json:"promql_expr_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(b, &tf); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(tf.RuleFiles, filepath.Base(rulesPath)) {
		t.Errorf("the test file loads %v, not %s", tf.RuleFiles, filepath.Base(rulesPath))
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	var exprs []string
	for _, tc := range tf.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
		for _, e := range tc.PromqlExprTest {
			exprs = append(exprs, e.Expr)
		}
	}
	for _, r := range rules {
		switch {
		case r.Alert != "":
			if !fires[r.Alert] || !silent[r.Alert] {
				t.Errorf("%s: tested firing %v, not firing %v; want both", r.Alert, fires[r.Alert], silent[r.Alert])
			}
		case r.Record != "":
			if !slices.ContainsFunc(exprs, func(e string) bool { return strings.Contains(e, r.Record) }) {
				t.Errorf("recording rule %s has no promql_expr_test", r.Record)
			}
		}
	}
}

// TestRulesNameRealMetrics: every dnsrace_* metric a rule reads is one the
// tracer registers, so a rename cannot leave the rules reading nothing.
func TestRulesNameRealMetrics(t *testing.T) {
	_, rules := loadRules(t)
	m := metrics.New(metrics.Config{PodLabels: true}, metrics.Source{
		EventsLost: func() uint64 { return 0 },
		Untracked:  func() uint64 { return 0 },
		Probes:     func() []metrics.Probe { return []metrics.Probe{{Hook: "h", Tier: "tracepoint", Attached: true}} },
		Conntrack:  func() map[uint32]ctstats.Counters { return map[uint32]ctstats.Counters{1: {}} },
	})
	// A pod series exists only after an incident: gather names from the
	// descriptions instead of the samples.
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{"dnsrace_pod_incidents_total": true}
	for _, f := range fams {
		names[f.GetName()] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_count", "_sum", "_bucket"} {
				names[f.GetName()+s] = true
			}
		}
	}
	re := regexp.MustCompile(`\bdnsrace_[a-z_]+`)
	for _, r := range rules {
		for _, n := range re.FindAllString(r.Expr, -1) {
			if !names[n] {
				t.Errorf("%s%s reads %s, which the tracer does not export (it has %v)", r.Alert, r.Record, n, names)
			}
		}
	}
}

// codeBlockAfter returns the fenced code block that follows marker in md.
func codeBlockAfter(t *testing.T, md, marker string) string {
	t.Helper()
	i := strings.Index(md, marker)
	if i < 0 {
		t.Fatalf("no %q in %s", marker, promDocPath)
	}
	rest := md[i:]
	start := strings.Index(rest, "```")
	nl := strings.Index(rest[start:], "\n")
	body := rest[start+nl+1:]
	end := strings.Index(body, "```")
	if start < 0 || nl < 0 || end < 0 {
		t.Fatalf("no code block after %q", marker)
	}
	return body[:end]
}

// TestPrometheusRuleWrapper runs the documented command that wraps the
// rule file in a PrometheusRule and checks what it makes.
func TestPrometheusRuleWrapper(t *testing.T) {
	doc, err := os.ReadFile(promDocPath)
	if err != nil {
		t.Fatal(err)
	}
	script := codeBlockAfter(t, string(doc), "<!-- prometheusrule:")
	// Everything but kubectl, in a folder holding only scripts/.
	script = strings.ReplaceAll(script, "kubectl apply -f dnsrace-prometheusrule.yaml\n", "")
	dir := t.TempDir()
	scripts, err := filepath.Abs("../../scripts")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(scripts, filepath.Join(dir, "scripts")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the documented command failed: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "dnsrace-prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pr struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       ruleFile       `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(b, &pr); err != nil {
		t.Fatalf("decoding the PrometheusRule strictly: %v\n%s", err, b)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" || pr.Metadata["name"] == nil {
		t.Errorf("apiVersion %q, kind %q, metadata %v", pr.APIVersion, pr.Kind, pr.Metadata)
	}
	want, _ := loadRules(t)
	if !reflect.DeepEqual(pr.Spec, want) {
		t.Errorf("spec.groups differ from %s:\n%+v\nwant\n%+v", rulesPath, pr.Spec, want)
	}
}

// TestScrapeConfigDoc: the documented scrape configuration is one
// Prometheus accepts, with the rule file in place of its example path.
// Debian's Prometheus is built without Kubernetes service discovery, so
// its kubernetes_sd_configs block is swapped for a static target: what is
// checked is the job, honor_labels, the relabelling and the rule file.
func TestScrapeConfigDoc(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		testutil.SkipOrFail(t, "promtool is not installed (Debian package prometheus; scripts/install-deps)")
	}
	doc, err := os.ReadFile(promDocPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg := codeBlockAfter(t, string(doc), "<!-- scrape-config:")
	rules, err := filepath.Abs(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	const example = "/etc/prometheus/dnsrace-rules.yaml"
	if !strings.Contains(cfg, example) || !strings.Contains(cfg, "job_name: dnsrace") || !strings.Contains(cfg, "honor_labels: true") {
		t.Fatalf("the documented config lost its rule file, job name or honor_labels:\n%s", cfg)
	}
	sd := regexp.MustCompile(`(?s)\n    kubernetes_sd_configs:\n.*?\n    relabel_configs:`)
	if !sd.MatchString(cfg) {
		t.Fatalf("no kubernetes_sd_configs block before relabel_configs:\n%s", cfg)
	}
	cfg = sd.ReplaceAllString(cfg, "\n    static_configs:\n      - targets: ['127.0.0.1:9153']\n    relabel_configs:")
	path := filepath.Join(t.TempDir(), "prometheus.yml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(cfg, example, rules)), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command(promtool, "check", "config", path)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out.String())
	}
	_, all := loadRules(t)
	if !strings.Contains(out.String(), fmt.Sprintf("%d rules found", len(all))) {
		t.Errorf("promtool did not load the rules:\n%s", out.String())
	}
}
