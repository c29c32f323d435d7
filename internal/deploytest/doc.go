// Package deploytest holds no code: its tests check the deployment files in
// scripts/ (scripts/daemonset.yaml), strictly decoded with the Kubernetes
// API types so that a misspelt field fails, and assert the properties the
// manifest promises: not privileged, exactly the capabilities it justifies,
// read-only host mounts, resource limits, scrape annotations, every node
// tolerated, and a dnsrace trace command line serving metrics.
package deploytest
