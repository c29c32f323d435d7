#!/usr/bin/env bash
# Self-test of scripts/vmtest's log parser and matrix printer: canned console logs, no VM, no root.
# Run: scripts/vmtest --self-test (or bash scripts/vmtest.d/selftest.sh).
set -euo pipefail

VMTEST=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/vmtest
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

fail() {
	echo "FAIL: $*"
	failures=$((failures + 1))
}

# expect NAME WANT_EXIT REGEX... -- LOG...: replays LOGs; checks the exit status and that every REGEX
# matches a line of the output (a REGEX starting with ! must match no line).
expect() {
	local name=$1 want=$2 got=0 re before=$failures
	shift 2
	local res=()
	while [ "$1" != -- ]; do
		res+=("$1")
		shift
	done
	shift
	DNSRACE_VMTEST_MATRIX_OUT=$tmp/$name.json "$VMTEST" --replay "$@" >"$tmp/$name.out" 2>&1 || got=$?
	[ "$got" = "$want" ] || fail "$name: exit $got, want $want"
	for re in "${res[@]}"; do
		if [[ $re == '!'* ]]; then
			grep -qE -- "${re#!}" "$tmp/$name.out" && fail "$name: output matches '${re#!}'"
		else
			grep -qE -- "$re" "$tmp/$name.out" || fail "$name: no line matches '$re'"
		fi
	done
	if command -v python3 >/dev/null; then
		python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/$name.json" || fail "$name: JSON does not parse"
	fi
	if [ "$failures" -gt "$before" ]; then
		sed 's/^/    /' "$tmp/$name.out"
	else
		echo "ok: $name"
	fi
}

# A clean run on two kernels, with kernel messages, CRs and test output around the markers.
cat >"$tmp/6.1.log" <<'EOF'
VMTEST-PLAN kernel=6.1 package=linux-image-6.1.0-57-cloud-amd64-unsigned version=6.1.192-3 uname=6.1.0-57-cloud-amd64 tiers=fentry,kprobe,tracepoint suites=probe,lab accel=tcg timeout=600
[    0.000000] Linux version 6.1.0-57-cloud-amd64
VMTEST-BOOT kernel=6.1 uname=6.1.0-57-cloud-amd64 uptime=2.95 cpus=2
VMTEST-MODULES kernel=6.1 loaded=23 failed=0 uptime=3.51
=== RUN   TestForcedTier
--- PASS: TestForcedTier (0.95s)
VMTEST-RESULT kernel=6.1 tier=fentry suite=probe status=pass rc=0 seconds=1 passed=1 skipped=0 failed=0
VMTEST-RESULT kernel=6.1 tier=fentry suite=lab status=skip rc=0 seconds=0 passed=0 skipped=2 failed=0
VMTEST-RESULT kernel=6.1 tier=kprobe suite=probe status=pass rc=0 seconds=1 passed=1 skipped=0 failed=0
[    4.200000] random: crng init done
VMTEST-RESULT kernel=6.1 tier=kprobe suite=lab status=pass rc=0 seconds=9 passed=3 skipped=0 failed=0
VMTEST-RESULT kernel=6.1 tier=tracepoint suite=probe status=pass rc=0 seconds=1 passed=1 skipped=0 failed=0
VMTEST-RESULT kernel=6.1 tier=tracepoint suite=lab status=pass rc=0 seconds=9 passed=3 skipped=0 failed=0
VMTEST-DONE kernel=6.1 uptime=30.1

VMTEST-HOST kernel=6.1 rc=0 seconds=33.0 timedout=0
EOF
sed -e 's/6\.1\.0-57-cloud-amd64/6.12.117+deb12-cloud-amd64/g' -e 's/kernel=6\.1 /kernel=6.12 /g' \
	-e 's/-unsigned version=6.1.192-3/-unsigned version=6.12.117-1~deb12u1/' -e 's/$/\r/' \
	-e 's/^VMTEST-RESULT kernel=6.12 tier=kprobe suite=probe/[    5.1] audit: x VMTEST-RESULT kernel=6.12 tier=kprobe suite=probe/' \
	"$tmp/6.1.log" >"$tmp/6.12.log"

# The runs table: a guest's RUNS markers, totals by case and each program's share.
cat >"$tmp/runs.log" <<'EOF'
VMTEST-PLAN kernel=6.12 package=linux-image-6.12.117+deb12-cloud-amd64-unsigned version=6.12.117-1~deb12u1 uname=6.12.117+deb12-cloud-amd64 tiers=fentry suites=runs accel=tcg timeout=600
VMTEST-BOOT kernel=6.12 uname=6.12.117+deb12-cloud-amd64 uptime=3.1 cpus=2
VMTEST-RUNS label=6.12 kernel=6.12.117+deb12-cloud-amd64 tier=fentry case=udp-forward unit=packet total=2.00 fe_skb_consume_udp=1.00 fe_udp_sendmsg=1.00 tp_kfree_skb_rx_sk=0.00
VMTEST-RUNS label=6.12 kernel=6.12.117+deb12-cloud-amd64 tier=fentry case=syscall-open unit=loop total=0.00
VMTEST-RESULT kernel=6.12 tier=fentry suite=runs status=pass rc=0 seconds=40 passed=1 skipped=0 failed=0
VMTEST-DONE kernel=6.12 uptime=44
VMTEST-HOST kernel=6.12 rc=0 wall=45.0 timed_out=0
EOF
expect runs 0 \
	'^BPF program runs per unit' \
	'^6\.12 +fentry +2\.00 +0\.00$' \
	'^  6\.12 fentry udp-forward: fe_skb_consume_udp=1\.00 fe_udp_sendmsg=1\.00$' \
	'!syscall-open:' \
	-- "$tmp/runs.log"

expect all-pass 0 \
	'^kernel +uname +suite +fentry +kprobe +tracepoint' \
	'^6\.1 +6\.1\.0-57-cloud-amd64 +probe +pass +pass +pass' \
	'^6\.1 +6\.1\.0-57-cloud-amd64 +lab +skip +pass +pass' \
	'^6\.12 +6\.12\.117\+deb12-cloud-amd64 +probe +pass +pass +pass' \
	'^kernel 6\.1: linux-image-6\.1\.0-57-cloud-amd64-unsigned=6\.1\.192-3, boot 2\.95 s, guest wall 33\.0 s, qemu rc 0, done' \
	'^cells: 10 pass, 2 skip, 0 fail; total wall time 66\.0 s' \
	'! {2,}fail' \
	-- "$tmp/6.1.log" "$tmp/6.12.log"
grep -q '"status": "skip"' "$tmp/all-pass.json" || fail "all-pass: JSON lacks the skip cell"
grep -q '"uname": "6.12.117+deb12-cloud-amd64"' "$tmp/all-pass.json" || fail "all-pass: JSON lacks the 6.12 uname"

# One failing cell makes the whole run fail.
sed -e 's/tier=kprobe suite=lab status=pass rc=0/tier=kprobe suite=lab status=fail rc=1/' \
	-e '/tier=kprobe suite=lab status=fail/i VMTEST-FAILED kernel=6.1 tier=kprobe suite=lab test=TestScenarios/snat-port' \
	"$tmp/6.1.log" >"$tmp/fail.log"
expect one-fail 1 \
	'^6\.1 +6\.1\.0-57-cloud-amd64 +lab +skip +fail +pass' \
	'^failed tests' \
	'^  6\.1 kprobe lab: TestScenarios/snat-port$' \
	'^cells: 9 pass, 2 skip, 1 fail' \
	-- "$tmp/fail.log" "$tmp/6.12.log"
grep -q '"tier": "kprobe", "suite": "lab", "status": "fail", .*"failed_tests": \["TestScenarios/snat-port"\]' "$tmp/one-fail.json" ||
	fail "one-fail: JSON lacks the failed cell and its test"

# A guest killed by the host timeout: the cells it never reported are failures marked timeout.
head -n 7 "$tmp/6.1.log" >"$tmp/timeout.log"
echo 'VMTEST-HOST kernel=6.1 rc=137 seconds=600.2 timedout=1' >>"$tmp/timeout.log"
expect timeout 1 \
	'^6\.1 +6\.1\.0-57-cloud-amd64 +probe +pass +fail\(timeout\) +fail\(timeout\)' \
	'^6\.1 +6\.1\.0-57-cloud-amd64 +lab +fail\(timeout\) +fail\(timeout\) +fail\(timeout\)' \
	'^cells: 1 pass, 0 skip, 5 fail' \
	'qemu rc 137, timeout' \
	-- "$tmp/timeout.log"

# A guest that never booted (kernel panic before /init): every planned cell fails.
printf '%s\n' "$(head -n 1 "$tmp/6.1.log")" '[    1.0] Kernel panic - not syncing: VFS: Unable to mount root fs' \
	'VMTEST-HOST kernel=6.1 rc=0 seconds=3.0 timedout=0' >"$tmp/panic.log"
expect no-boot 1 \
	'^6\.1 +- +probe +fail\(no-result\) +fail\(no-result\) +fail\(no-result\)' \
	'^cells: 0 pass, 0 skip, 6 fail' \
	-- "$tmp/panic.log"

# A log with no plan and no marker at all has no cells: that is a failure too, not a vacuous pass.
echo 'garbage' >"$tmp/empty.log"
expect empty 1 '^cells: 0 pass, 0 skip, 0 fail' -- "$tmp/empty.log"

# A status the guest should never print counts as a failure.
sed 's/tier=fentry suite=probe status=pass/tier=fentry suite=probe status=weird/' "$tmp/6.1.log" >"$tmp/weird.log"
expect unknown-status 1 '^6\.1 +6\.1\.0-57-cloud-amd64 +probe +fail +pass +pass' -- "$tmp/weird.log"

# A suite planned in only some tiers (suite_tiers=): its other cells are not planned ("-"), a tier-less
# suite ("any") gets its own column, and a missing "any" result is still a failure.
cat >"$tmp/tiers.log" <<'EOF'
VMTEST-PLAN kernel=6.1 package=p version=1 uname=u tiers=fentry,kprobe,tracepoint,any suites=probe,lab suite_tiers=probe:fentry+kprobe+tracepoint,lab:any accel=tcg timeout=600
VMTEST-BOOT kernel=6.1 uname=6.1.0-57-cloud-amd64 uptime=2.95 cpus=2
VMTEST-RESULT kernel=6.1 tier=fentry suite=probe status=pass rc=0 seconds=1 passed=1 skipped=0 failed=0
VMTEST-RESULT kernel=6.1 tier=kprobe suite=probe status=pass rc=0 seconds=1 passed=1 skipped=0 failed=0
VMTEST-RESULT kernel=6.1 tier=tracepoint suite=probe status=pass rc=0 seconds=1 passed=1 skipped=0 failed=0
VMTEST-RESULT kernel=6.1 tier=any suite=lab status=pass rc=0 seconds=90 passed=7 skipped=0 failed=0
VMTEST-DONE kernel=6.1 uptime=100
VMTEST-HOST kernel=6.1 rc=0 seconds=102.5 timedout=0
EOF
expect suite-tiers 0 \
	'^kernel +uname +suite +fentry +kprobe +tracepoint +any' \
	'^6\.1 +6\.1\.0-57-cloud-amd64 +probe +pass +pass +pass +- *$' \
	'^6\.1 +6\.1\.0-57-cloud-amd64 +lab +- +- +- +pass' \
	'^cells: 4 pass, 0 skip, 0 fail' \
	-- "$tmp/tiers.log"
grep -v 'tier=any' "$tmp/tiers.log" >"$tmp/tiers-missing.log"
expect suite-tiers-missing 1 \
	'^6\.1 +6\.1\.0-57-cloud-amd64 +lab +- +- +- +fail\(no-result\)' \
	'^cells: 3 pass, 0 skip, 1 fail' \
	-- "$tmp/tiers-missing.log"

# A guest kernel that dies (here of the int3 oops, docs/vmtest.md): its cells fail as no-result and
# the kernel line names the oops and the function it hit.
cat >"$tmp/oops.log" <<'EOF'
VMTEST-PLAN kernel=6.12 package=p version=1 pin=pinned wanted=p suite=bookworm arch=amd64 uname=u tiers=any suites=tpchurn suite_tiers=tpchurn:any accel=tcg tcg_thread=multi smp=2 timeout=600
VMTEST-BOOT kernel=6.12 uname=6.12.117+deb12-cloud-amd64 uptime=1.85 cpus=2
=== RUN   TestRawTracepointChurn
[    2.697780] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI
[    2.698030] CPU: 1 UID: 0 PID: 12 Comm: kworker/u8:0 Not tainted 6.12.117+deb12-cloud-amd64 #1  Debian 6.12.117-1~deb12u1
[    2.698365] RIP: 0010:kmem_cache_free+0xaf/0x450
[    2.700027] Kernel panic - not syncing: Fatal exception in interrupt
VMTEST-HOST kernel=6.12 rc=0 seconds=4.1 timedout=0
EOF
expect oops 1 \
	'^6\.12 +6\.12\.117\+deb12-cloud-amd64 +tpchurn +fail\(no-result\)' \
	'guest kernel died: Oops: int3: 0000 at kmem_cache_free\+0xaf/0x450$' \
	-- "$tmp/oops.log"
grep -q '"crash": "Oops: int3: 0000 at kmem_cache_free+0xaf/0x450"' "$tmp/oops.json" || fail "oops: JSON lacks the crash"

# A kernel pin the archive dropped: the matrix names the build used and says it is a fallback; the
# JSON has the architecture, the pin and the wanted package.
sed -e 's/^VMTEST-PLAN kernel=6.1 package=linux-image-6.1.0-57-cloud-amd64-unsigned /VMTEST-PLAN kernel=6.1 package=linux-image-6.1.0-57-cloud-amd64-unsigned pin=fallback wanted=linux-image-6.1.0-40-cloud-amd64-unsigned arch=arm64 /' \
	"$tmp/6.1.log" >"$tmp/fallback.log"
expect fallback 0 \
	'^kernel 6\.1: linux-image-6\.1\.0-57-cloud-amd64-unsigned=6\.1\.192-3, .*done \(fallback: kernels\.txt pins linux-image-6\.1\.0-40-cloud-amd64-unsigned, which the archive no longer has\)$' \
	'!guest kernel died' \
	-- "$tmp/fallback.log"
grep -q '"arch": "arm64", .*"pin": "fallback", "wanted": "linux-image-6.1.0-40-cloud-amd64-unsigned"' "$tmp/fallback.json" ||
	fail "fallback: JSON lacks arch, pin or wanted"

# One kernel split over two guests (--split): their cells make one row per suite, each guest has its
# own kernel line naming its tiers, and a cell the fentry guest never reported fails although the
# other guest finished.
grep -v 'tier=kprobe\|tier=any' "$tmp/tiers.log" | sed 's/ tiers=fentry,kprobe,tracepoint,any / tiers=fentry,tracepoint /' >"$tmp/split-a.log"
grep -v 'tier=fentry\|tier=tracepoint' "$tmp/tiers.log" | sed -e 's/ tiers=fentry,kprobe,tracepoint,any / tiers=kprobe,any /' \
	-e 's/seconds=102.5/seconds=40.0/' >"$tmp/split-b.log"
expect split 0 \
	'^6\.1 +6\.1\.0-57-cloud-amd64 +probe +pass +pass +pass +- *$' \
	'^6\.1 +6\.1\.0-57-cloud-amd64 +lab +- +- +- +pass' \
	'^kernel 6\.1: p=1, boot 2\.95 s, guest wall 102\.5 s, qemu rc 0, done \(tiers fentry,tracepoint\)$' \
	'^kernel 6\.1: p=1, boot 2\.95 s, guest wall 40\.0 s, qemu rc 0, done \(tiers kprobe,any\)$' \
	'^cells: 4 pass, 0 skip, 0 fail; total wall time 142\.5 s' \
	-- "$tmp/split-a.log" "$tmp/split-b.log"
grep -q '"tiers": "kprobe,any"' "$tmp/split.json" || fail "split: JSON lacks the guest's tiers"
grep -v 'tier=fentry' "$tmp/split-a.log" >"$tmp/split-a-missing.log"
expect split-missing 1 \
	'^6\.1 +6\.1\.0-57-cloud-amd64 +probe +fail\(no-result\) +pass +pass +- *$' \
	'^cells: 3 pass, 0 skip, 1 fail' \
	-- "$tmp/split-a-missing.log" "$tmp/split-b.log"

# same CMD... -- WANT: the output of `scripts/vmtest --call CMD...` must be WANT.
same() {
	local args=() got
	while [ "$1" != -- ]; do
		args+=("$1")
		shift
	done
	got=$("$VMTEST" --call "${args[@]}" 2>&1) || true
	if [ "$got" = "$2" ]; then echo "ok: ${args[*]}"; else fail "${args[*]}: got '$got', want '$2'"; fi
}

# Kernel series for the pin fallback.
same series_glob linux-image-6.1.0-57-cloud-amd64-unsigned -- 'linux-image-6.1.0-*-cloud-amd64-unsigned'
same series_glob linux-image-6.12.117+deb12-cloud-amd64-unsigned -- 'linux-image-6.12.*+deb12-cloud-amd64-unsigned'
same series_glob linux-image-5.10.0-32-cloud-arm64 -- 'linux-image-5.10.0-*-cloud-arm64'
same series_glob linux-image-cloud-amd64 -- 'linux-image-cloud-amd64'

# The host's Debian mirror, from deb822 and one-line sources; vendors' repositories are ignored.
mkdir -p "$tmp/apt/sources.list.d"
echo 'VERSION_CODENAME=bookworm' >"$tmp/os-release"
cat >"$tmp/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
# a comment
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
EOF
echo 'deb https://packages.vendor.example/apt cloud-sdk-bookworm main' >"$tmp/apt/sources.list.d/vendor.list"
export DNSRACE_VMTEST_APT_ETC=$tmp/apt DNSRACE_VMTEST_OS_RELEASE=$tmp/os-release
same debian_mirrors -- 'http://mirror.example/debian http://mirror.example/debian-security'
rm "$tmp/apt/sources.list.d/debian.sources"
echo 'deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian/ bookworm main' >"$tmp/apt/sources.list"
same debian_mirrors -- 'http://one.example/debian http://one.example/debian-security'

# kernels.txt fields: suite= and arch= default to the host's codename and amd64.
cat >"$tmp/kernels.txt" <<'EOF'
# comment
5.10 linux-image-5.10.0-32-cloud-amd64-unsigned suite=bullseye   # trailing comment
6.1-arm64 linux-image-6.1.0-57-cloud-arm64-unsigned arch=arm64
EOF
DNSRACE_VMTEST_KERNELS_FILE=$tmp/kernels.txt same read_kernels -- "$(printf '%s\n' \
	'5.10 linux-image-5.10.0-32-cloud-amd64-unsigned bullseye amd64' \
	'6.1-arm64 linux-image-6.1.0-57-cloud-arm64-unsigned bookworm arm64')"
echo '6.1 linux-image-6.1.0-57-cloud-amd64-unsigned arch=riscv64' >"$tmp/bad-kernels.txt"
if out=$(DNSRACE_VMTEST_KERNELS_FILE=$tmp/bad-kernels.txt "$VMTEST" --call read_kernels 2>&1); then
	fail "read_kernels accepted arch=riscv64: $out"
else
	echo "ok: read_kernels refuses an unknown field"
fi

# --split: the default puts the fentry tier in a guest of its own and the rest in another; a plan
# without fentry is one guest; tiers in no group make one more; "all" keeps one guest per kernel.
same split_tiers fentry,kprobe,tracepoint,any -- "$(printf '%s\n' fentry kprobe,tracepoint,any)"
same split_tiers kprobe,tracepoint -- kprobe,tracepoint
DNSRACE_VMTEST_SPLIT=kprobe same split_tiers fentry,kprobe,any -- "$(printf '%s\n' kprobe fentry,any)"
DNSRACE_VMTEST_SPLIT=all same split_tiers fentry,kprobe,any -- fentry,kprobe,any
unset DNSRACE_VMTEST_APT_ETC DNSRACE_VMTEST_OS_RELEASE

if [ "$failures" -gt 0 ]; then
	echo "selftest: $failures failure(s)"
	exit 1
fi
echo "selftest: all passed"
