#!/usr/bin/env bash
# make crossarch: the architectures the stock node-local-dns image ships
# (amd64, arm64, arm, ppc64le, s390x), built and run on this amd64 machine
# under Debian's qemu-user-static (user-mode emulation: go test -exec, no
# binfmt entry, nothing registered on the host). docs/crossarch.md says what
# runs where and what the emulator cannot do.
#
#   1. cmd/nodelocaldns for all five, as the Dockerfile builds it
#      (CGO_ENABLED=0, -trimpath, -ldflags "-s -w").
#   2. The packages that make raw syscalls, read control messages and lay
#      out wire bytes (wire, cache, server, forward, netsetup) pass their
#      tests under qemu for arm64 and arm (32-bit) and s390x (big-endian).
#      No -race: the race detector needs cgo and has no arm port; amd64
#      runs these tests with it in make test. netsetup's namespace tests run
#      too (as root): the binary re-executes itself under the same emulator
#      (NLD_TEST_EMULATOR). On s390x the tests that look a link up by name
#      are skipped: QEMU's netlink translation passes RTM_GETLINK requests
#      to the kernel unswapped (docs/crossarch.md).
#   3. ppc64le: the same test binaries are built and started (-run '^$').
#   4. The daemon of step 1 for arm64, arm, ppc64le and s390x, run under
#      qemu on loopback between two upstreams and asked with dig: misses
#      over UDP and TCP, hits (test/deploy TestEndToEndUnderEmulation).
#   5. The image for arm64 from the Dockerfile, run once under binfmt, and
#      its bill of materials (test/image/build.sh; the e2e builds amd64's).
#
# Any failure on any architecture fails the run. Installs nothing: .ci/run
# installs qemu-user-static, debootstrap and buildah. Environment: NLD_CROSS_ARCHES (default
# "arm64 arm s390x") picks the architectures of step 2; NLD_CROSS_IMAGE=0
# leaves out step 5 (6 minutes cold; .ci/run does, for its time budget).
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
log() { echo "crossarch: [$(($(date +%s) - t0))s] $*" >&2; }

declare -A emu=([arm64]=qemu-aarch64-static [arm]=qemu-arm-static [ppc64le]=qemu-ppc64le-static [s390x]=qemu-s390x-static)
for e in "${emu[@]}"; do
	command -v "$e" >/dev/null || { echo "crossarch: $e not found: apt-get install qemu-user-static" >&2; exit 1; }
done
out=$(mktemp -d /tmp/nld-crossarch.XXXXXX)
trap 'rm -rf "$out"' EXIT

step=$(date +%s)
for arch in amd64 arm64 arm ppc64le s390x; do
	CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -ldflags='-s -w' -o "$out/nodelocaldns-$arch" ./cmd/nodelocaldns
done
log "built cmd/nodelocaldns for amd64 arm64 arm ppc64le s390x in $(($(date +%s) - step)) s"

pkgs=(./internal/wire ./internal/cache ./internal/server ./internal/forward ./internal/netsetup)
# Every test of netsetup that asks for a link by name (LinkByName and the
# link dump send RTM_GETLINK): on s390x QEMU hands the kernel a
# big-endian request, which it refuses (EINVAL).
s390x_skip='^(TestDNSWithoutConntrack|TestFallbackLifecycle|TestNodeListenerFallsBackToTheNodeResolvers|TestEnsureLinkAdopt|TestEnsureLinkDummy|TestEnsureLinkNoDummy|TestLinkRepair|TestRules|TestRulesExtraPort|TestLockWait)$'
# emutest ARCH EMULATOR [go test args]: the tests under the emulator, their
# verbose output kept in $out and shown whole when they fail. netsetup's
# re-executed children are bounded (50 s) and one killed is tried once more
# (internal/netsetup/netns_test.go, docs/crossarch.md): each such retry is
# counted here, so none passes unseen.
emutest() {
	local arch=$1 e=$2 tlog
	shift 2
	tlog=$(mktemp "$out/test-$arch.XXXXXX")
	if ! GOARCH=$arch NLD_TEST_EMULATOR=$e go test -v -count=1 -timeout 10m -exec "$e" "$@" >"$tlog" 2>&1; then
		cat "$tlog" >&2
		log "$arch: FAILED under $e: go test $*"
		return 1
	fi
	grep -E '^(ok|FAIL)\b' "$tlog" >&2
	retries=$((retries + $(grep -c 'trying once more' "$tlog" || true)))
}
for arch in ${NLD_CROSS_ARCHES:-arm64 arm s390x}; do
	step=$(date +%s) retries=0
	e=${emu[$arch]:?"NLD_CROSS_ARCHES: $arch is not one of arm64 arm ppc64le s390x"}
	if [ "$arch" = s390x ]; then
		emutest "$arch" "$e" "${pkgs[@]:0:4}"
		emutest "$arch" "$e" -skip "$s390x_skip" ./internal/netsetup
	else
		emutest "$arch" "$e" "${pkgs[@]}"
	fi
	log "$arch: ${pkgs[*]} passed under $e in $(($(date +%s) - step)) s ($retries netns children killed after 50 s and run again)"
done

step=$(date +%s)
GOARCH=ppc64le go test -count=1 -run '^$' -exec "${emu[ppc64le]}" "${pkgs[@]}" >/dev/null
log "ppc64le: test binaries built and started in $(($(date +%s) - step)) s"

step=$(date +%s)
NLD_CROSS_ARCHES="arm64 arm ppc64le s390x" NLD_CROSS_BINDIR=$out \
	go test -count=1 -timeout 10m -run '^TestEndToEndUnderEmulation$' -v ./test/deploy | grep -E '^( *--- |ok|FAIL)'
log "the daemon answered hits and misses under arm64 arm ppc64le s390x in $(($(date +%s) - step)) s"
if [ "${NLD_CROSS_IMAGE:-1}" = 0 ]; then
	log "the arm64 image: not built (NLD_CROSS_IMAGE=0)"
else
	step=$(date +%s)
	test/image/build.sh arm64 "$out"
	log "arm64 image and its SBOM in $(($(date +%s) - step)) s ($(du -m "$out/nodelocaldns-arm64.tar" | cut -f1) MB, $(grep -c '"SPDXID"' "$out/nodelocaldns-arm64.spdx.json") SPDX elements)"
fi
log "done in $(($(date +%s) - t0)) s"
