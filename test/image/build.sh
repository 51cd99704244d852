#!/usr/bin/env bash
# The nodelocaldns image for another architecture, from the repository's
# Dockerfile unchanged, without a Docker engine, and its bill of materials:
#
#   test/image/build.sh ARCH OUTDIR     (root; ARCH: arm64, arm, ppc64le, s390x)
#
# writes OUTDIR/nodelocaldns-ARCH.tar (docker-archive, localhost/nodelocaldns:ARCH)
# and OUTDIR/nodelocaldns-ARCH.spdx.json (cmd/nodelocaldns-sbom). The
# Dockerfile's build stage runs on this machine (--platform=$BUILDPLATFORM:
# Go cross-compiles); its runtime stage's RUN apt-get runs the target's
# Debian under user-mode emulation: a binfmt_misc entry for the target
# (Debian's qemu-user-static) is registered for the build and removed after,
# whatever the outcome, under a lock so that two builds do not race on it.
# The Debian base (debootstrap --foreign, then its second stage under the
# emulator) is cached as a tarball in $NLD_CACHE (/var/cache/nodelocaldns-test),
# as test/e2e/images.sh caches the amd64 one; buildah's storage for ARCH is
# its own (an image name holds one architecture). docs/crossarch.md.
set -euo pipefail
arch=${1:?usage: $0 ARCH OUTDIR}
out=${2:?usage: $0 ARCH OUTDIR}
repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${NLD_CACHE:-/var/cache/nodelocaldns-test}
declare -A qemu=([arm64]=aarch64 [arm]=arm [ppc64le]=ppc64le [s390x]=s390x)
declare -A debarch=([arm64]=arm64 [arm]=armhf [ppc64le]=ppc64el [s390x]=s390x)
q=${qemu[$arch]:?"$0: $arch is not one of arm64 arm ppc64le s390x"}
t0=$(date +%s)
log() { echo "image-$arch: [$(($(date +%s) - t0))s] $*" >&2; }
mkdir -p "$out" "$cache/buildah"

# binfmt: registered for this build only.
binfmt=/proc/sys/fs/binfmt_misc
conf=/usr/lib/binfmt.d/qemu-$q.conf
[ -r "$conf" ] || { echo "$0: $conf missing: apt-get install qemu-user-static" >&2; exit 1; }
exec 8>/run/lock/nld-binfmt-$q.lock
flock 8
mounted=
if [ ! -e "$binfmt/register" ]; then
	mount -t binfmt_misc binfmt_misc "$binfmt"
	mounted=1
fi
registered=
cleanup() {
	[ -n "$registered" ] && echo -1 >"$binfmt/qemu-$q" 2>/dev/null
	[ -n "$mounted" ] && [ -z "$(ls "$binfmt" | grep -v -e '^register$' -e '^status$')" ] && umount "$binfmt" 2>/dev/null
	true
}
trap cleanup EXIT
if [ ! -e "$binfmt/qemu-$q" ]; then
	cat "$conf" >"$binfmt/register"
	registered=1
fi

bh=(buildah --root "$cache/buildah/storage-$arch" --runroot "/run/nld-buildah-$arch" --storage-driver overlay)
have() { "${bh[@]}" inspect --type image "$1" >/dev/null 2>&1; }

# minbase DEBARCH TARBALL: Debian bookworm minbase (what debian:bookworm-slim
# is) for DEBARCH, cached as TARBALL; a foreign one runs its second stage
# under the emulator.
minbase() {
	[ -s "$2" ] && return
	log "debootstrap bookworm $1 (once, cached in $2)"
	local tmp
	tmp=$(mktemp -d)
	debootstrap --arch="$1" --variant=minbase bookworm "$tmp/root" http://deb.debian.org/debian \
		>"$cache/debootstrap-$1.log" 2>&1 || { tail -20 "$cache/debootstrap-$1.log" >&2; rm -rf "$tmp"; exit 1; }
	rm -rf "$tmp/root/var/cache/apt/archives/"*.deb "$tmp/root/var/lib/apt/lists/"*
	tar -C "$tmp/root" -cf "$2.tmp" .
	mv "$2.tmp" "$2"
	rm -rf "$tmp"
}
rootfs=$cache/debian-bookworm-minbase-${debarch[$arch]}.tar
minbase "${debarch[$arch]}" "$rootfs"
# This machine's, for the build stage: the tarball test/e2e/images.sh makes
# and caches (under its lock).
exec 7>"$cache/buildah/.lock"
flock 7
minbase "$(dpkg --print-architecture)" "$cache/debian-bookworm-minbase.tar"
flock -u 7
debian=docker.io/library/debian:bookworm-slim
if ! have "$debian"; then
	c=$("${bh[@]}" from scratch)
	"${bh[@]}" add "$c" "$rootfs" / >/dev/null
	"${bh[@]}" config --arch "$arch" --os linux --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd bash "$c"
	"${bh[@]}" commit -q --rm "$c" "$debian" >/dev/null
fi
# The build stage's image, on this machine's architecture: test/e2e/images.sh
# made it in the amd64 storage; copied here once.
go_version=$(sed -n 's/^ARG GO_VERSION=//p' "$repo/Dockerfile")
golang=docker.io/library/golang:$go_version
if ! have "$golang"; then
	[ "go$go_version" = "$(go env GOVERSION)" ] || { echo "$0: the Dockerfile wants Go $go_version, this machine has $(go env GOVERSION)" >&2; exit 1; }
	tmp=$(mktemp -d)
	tar -C "$tmp" -xf "$cache/debian-bookworm-minbase.tar"
	c=$("${bh[@]}" from scratch)
	"${bh[@]}" copy "$c" "$tmp" / >/dev/null
	"${bh[@]}" copy "$c" "$(go env GOROOT)" /usr/local/go >/dev/null
	"${bh[@]}" copy "$c" /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt >/dev/null
	"${bh[@]}" config --arch "$(go env GOARCH)" --os linux --env GOPATH=/go \
		--env PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --workingdir /go "$c"
	"${bh[@]}" commit -q --rm "$c" "$golang" >/dev/null
	rm -rf "$tmp"
fi

log "buildah bud --arch $arch"
image=localhost/nodelocaldns:$arch
"${bh[@]}" bud -q --pull-never --isolation chroot --network host --layers \
	--arch "$arch" --build-arg BUILDPLATFORM="linux/$(go env GOARCH)" --build-arg TARGETPLATFORM="linux/$arch" --build-arg TARGETARCH="$arch" \
	--build-arg VERSION="$arch" --build-arg REVISION="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)" \
	-t "$image" -f "$repo/Dockerfile" "$repo" >/dev/null
# The image runs on its architecture: its binary and its iptables, under
# the emulator (iptables-legacy: QEMU's user mode passes no netfilter
# netlink socket, so iptables-nft cannot start under it; its binary is there).
c=$("${bh[@]}" from --pull=never --arch "$arch" "$image")
ran=$("${bh[@]}" run --isolation chroot "$c" -- /nodelocaldns -version 2>&1 && "${bh[@]}" run --isolation chroot "$c" -- iptables-legacy --version 2>&1 &&
	"${bh[@]}" run --isolation chroot "$c" -- sh -c 'test -x /usr/sbin/xtables-nft-multi && uname -m' 2>&1) ||
	{ echo "$0: the $arch image does not run: $ran" >&2; "${bh[@]}" rm "$c" >/dev/null; exit 1; }
"${bh[@]}" rm "$c" >/dev/null
log "runs: $(echo "$ran" | tr '\n' ' ')"
rm -f "$out/nodelocaldns-$arch.tar"
"${bh[@]}" push -q "$image" "docker-archive:$out/nodelocaldns-$arch.tar:$image" >/dev/null
(cd "$repo" && go run ./cmd/nodelocaldns-sbom -image "$out/nodelocaldns-$arch.tar" -name "$image") >"$out/nodelocaldns-$arch.spdx.json"
log "$out/nodelocaldns-$arch.tar and its SBOM"
