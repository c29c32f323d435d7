// Package clashfix tells which conntrack insertion-race classes a kernel
// resolves and which still drop a packet, from the kernel's release string and,
// when available, from facts read out of its BTF and /proc/kallsyms.
//
// The contract: Assess never guesses silently. Every class verdict carries the
// basis it was decided on ("BTF: enum ip_conntrack_status has
// IPS_NAT_CLASH_BIT", "release 5.4 < 5.6", ...). BTF facts win over the
// release number, because distributions backport the fixes (Ubuntu's Azure
// 4.15 kernels carry ed07d9a021df); the release table (docs/kernel.md §2) is the
// fallback when BTF is absent or does not answer.
//
// The classes, oldest fix first:
//
//   - identical 5-tuple, no NAT: merged since 71d8c47fc653 (4.6);
//   - same 5-tuple, same DNAT result: merged since ed07d9a021df (4.19,
//     reply tuples must match) and 4e35c1cb9460 (5.0, same-origin skip);
//   - same 5-tuple, different DNAT backends (kube-proxy's random DNAT):
//     inserted reply-only as IPS_NAT_CLASH since 6a757c07e51f (5.6);
//   - reverse collisions (a:b→c:d against c:d→a:b): a4e6a1031e77 (6.12);
//   - different original tuples, same SNAT reply tuple: dropped on every
//     kernel (insert_failed and drop both count it).
//
// Reading BTF and kallsyms is done by the caller (ProbeBTF, ScanKallsyms) so
// that doctor can point them at a host root mounted elsewhere.
package clashfix
