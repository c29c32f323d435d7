// Package kconfig reads one option of the running kernel's build
// configuration, from /proc/config.gz, /boot/config-<release> or
// /usr/lib/modules/<release>/config.
//
// Contract: Lookup opens the files through the caller's Opener, so the
// same code reads the node's own files (os.Open) or a host tree mounted
// elsewhere (doctor's root, /host in a debug pod). It never fails: a file
// that cannot be opened or read to its end is skipped, and no readable
// file gives an empty answer. Release names the running kernel for it.
package kconfig
