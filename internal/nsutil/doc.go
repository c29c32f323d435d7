// Package nsutil creates and removes named network namespaces (the
// /run/netns/NAME bind mounts that iproute2 uses), runs Go code inside one,
// and starts programs inside one the way `ip netns exec` does: in a private
// mount namespace where every file of /etc/netns/NAME/ is bind-mounted over
// its twin in /etc, so a real resolver reads the namespace's resolv.conf.
//
// Go code runs in a namespace on a locked OS thread that is set back to its
// own namespace afterwards; if that fails the thread stays locked and the
// runtime ends it, so no goroutine ever runs on a thread left in the wrong
// namespace. (The main thread is never ended by Go, and its namespace is
// the process's: restoring, not discarding, is what keeps it right.)
//
// Programs start through a re-exec of the current binary (os.Args[0] ==
// ExecHelperArg); the binary's main must call MaybeExecHelper first thing.
package nsutil
