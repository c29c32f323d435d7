#!/bin/sh
# /init of a vmtest guest (busybox sh, PID 1), packed by internal/vmtest; never run on a host.
# It mounts the pseudo file systems, loads /vmtest/modules in order, runs every suite of
# /vmtest/suites (<name> <pattern> <tier,...>) once per tier of vmtest.tiers= under test2json
# (but those vmtest.skip= names),
# and frames each run with VMTEST-CELL and VMTEST-END lines (the markers: console.go).

/bin/busybox mkdir -p /bin /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin HOME=/root TMPDIR=/tmp
[ -x /usr/bin/dnsrace ] && export DNSRACE_BIN=/usr/bin/dnsrace
umask 022

mkdir -p /proc /sys /dev /run /tmp /root /var
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
ln -sfn /run /var/run
mkdir -p /run/netns /etc/netns
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
ulimit -l unlimited 2>/dev/null
hostname vmtest
ip link set lo up

off() {
	sync
	poweroff -f
	sleep 5
	echo o >/proc/sysrq-trigger
}
up() { cut -d' ' -f1 /proc/uptime; }
kernel=$(cat /vmtest/kernel)

if grep -q 'vmtest.probe=1' /proc/cmdline; then
	echo "VMTEST-PROBE-OK kernel=$kernel"
	off
fi
echo "VMTEST-BOOT kernel=$kernel uname=$(uname -r) uptime=$(up) cpus=$(nproc)"

loaded=0 failed=0
while read -r mod; do
	if out=$(insmod "/lib/modules/vmtest/$mod" 2>&1); then
		loaded=$((loaded + 1))
	else
		case $out in
		*"File exists"*) ;;
		*) failed=$((failed + 1)) && echo "vmtest: insmod $mod: $out" ;;
		esac
	fi
done </vmtest/modules
echo "VMTEST-MODULES loaded=$loaded failed=$failed uptime=$(up)"
# The lab's table-full scenario fills the node's conntrack table one ctnetlink request per entry,
# about 0.7 ms each under TCG: the 65,536 entries a 2 GiB guest gets took 45 s of every fentry cell.
# nf_conntrack_max is global (read-only inside a namespace), and the guest is the tests' alone.
ctmax=/proc/sys/net/netfilter/nf_conntrack_max
[ -w "$ctmax" ] && echo 16384 >"$ctmax" && echo "vmtest: nf_conntrack_max=$(cat "$ctmax")"
[ -x /usr/bin/getent ] && echo "VMTEST-GETENT localhost=$(getent hosts localhost | tr -s ' \t' ',')"

# DNSRACE_TEST_RESOLVER=go: under TCG a glibc lookup (a process per lookup) takes about a second,
# too few flows for the lab's SNAT ports to run out, so the trace tests drive the lab's in-process
# resolver (same 5 s timeout and retry); glibc itself runs in the lab suite.
# DNSRACE_TEST_RACE_ATTEMPTS=18: the vCPUs take turns (single-threaded TCG), so a race that needs
# two CPUs at the same instant happens about once per 10 s run; a test may run it up to 18 times.
ttimeout=$(cat /vmtest/test-timeout)
guestenv=$(tr '\n' ' ' </vmtest/env)
tiers=
skip=
for w in $(cat /proc/cmdline); do
	case $w in
	vmtest.tiers=?*) tiers=$(echo "${w#vmtest.tiers=}" | tr , ' ') ;;
	vmtest.skip=?*) skip=${w#vmtest.skip=} ;;
	esac
done
for tier in $tiers; do
	while read -r name pattern stiers; do
		case ",$stiers," in *",$tier,"*) ;; *) continue ;; esac
		case ",$skip," in *",$name,"*) continue ;; esac
		tierenv="DNSRACE_TEST_TIER=$tier"
		[ "$tier" = any ] && tierenv="DNSRACE_TEST_TIER="
		echo "VMTEST-CELL tier=$tier suite=$name"
		start=$(date +%s)
		# shellcheck disable=SC2086 # one word per K=V
		(cd "/vmtest/suites.d/$name" && exec env "$tierenv" CI=true DNSRACE_TEST_RESOLVER=go \
			DNSRACE_TEST_RACE_ATTEMPTS=18 $guestenv test2json -p "$name" "./$name.test" \
			-test.v=test2json -test.run "$pattern" -test.timeout "${ttimeout}s" -test.count 1) </dev/null 2>&1
		rc=$?
		echo "VMTEST-END tier=$tier suite=$name rc=$rc seconds=$(($(date +%s) - start))"
	done </vmtest/suites
done
echo "VMTEST-DONE uptime=$(up)"
off
