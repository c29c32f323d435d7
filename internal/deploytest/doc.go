// Package deploytest holds no code: its tests check the files an operator
// deploys or reads. The DaemonSet (scripts/daemonset.yaml) is decoded
// strictly with the Kubernetes API types, so that a misspelt field fails,
// and held to the properties the manifest promises: not privileged, exactly
// the capabilities it justifies, read-only host mounts, resource limits,
// scrape annotations, every node tolerated, and a dnsrace trace command line
// serving metrics. The Prometheus rules (scripts/prometheus-rules.yaml) read
// only metrics the tracer exports, are all tested by promtool, and each
// alert's runbook is a heading of docs/prometheus.md, whose documented scrape
// and PrometheusRule wrapper work. Every relative link of the README, the
// changelog and docs/ names a file, and a heading where it names one; the
// README, the performance and VM pages and the BPF sources stay within the
// sizes a newcomer reads in an afternoon, and no section is titled by a day.
package deploytest
