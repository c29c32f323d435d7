// Package nsutil creates and removes named network namespaces (the
// /run/netns/NAME bind mounts that iproute2 uses), runs Go code inside one,
// and starts programs inside one the way `ip netns exec` does: in a private
// mount namespace where every file of /etc/netns/NAME/ is bind-mounted over
// its twin in /etc, so a real resolver reads the namespace's resolv.conf.
//
// Go code runs in a namespace on a locked OS thread that is never unlocked:
// when the function returns the runtime ends the thread, so no goroutine can
// ever run on a thread left in the wrong namespace.
//
// Programs start through a re-exec of the current binary (os.Args[0] ==
// ExecHelperArg); the binary's main must call MaybeExecHelper first thing.
package nsutil
