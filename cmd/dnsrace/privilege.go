package main

import "os"

// requireRoot returns a usage error when the process lacks the privileges
// that netns, netfilter and BPF work needs. dnsrace checks the effective uid
// rather than single capabilities: every command that reaches this point
// needs several (CAP_SYS_ADMIN for setns and mounts, CAP_NET_ADMIN, CAP_BPF).
func requireRoot(what string) error {
	if os.Geteuid() != 0 {
		return usagef("%s needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_BPF): run it with sudo", what)
	}
	return nil
}
