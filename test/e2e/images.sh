#!/usr/bin/env bash
# Build the e2e cluster's images without a Docker engine and write them as
# docker-archive tarballs for `ctr images import`:
#
#   test/e2e/images.sh OUTDIR
#
#   localhost/nodelocaldns:e2e  from the repository's Dockerfile (buildah bud,
#                               pulls disabled)
#   localhost/pause:e2e         images/pause, a static Go binary
#   localhost/coredns:e2e       CoreDNS (test/coredns/build.sh), kube-dns
#   localhost/client:e2e        images/client/Containerfile: getent, dig
#   localhost/node-cache:e2e    images/node-cache/Containerfile: the stock
#                               node-local-dns binary (the oracle,
#                               $NODELOCALDNS_ORACLES or ../shared/oracles
#                               beside the repository), unpacked into a
#                               temporary build context and checked against
#                               its sha256, never copied into the repository;
#                               missing, no image (the migration test skips,
#                               or fails under CI=true)
#
# The Dockerfile's base images are made here, under the names it uses:
# docker.io/library/debian:bookworm-slim from debootstrap --variant=minbase
# (cached as a tarball), and docker.io/library/golang:GO_VERSION from that
# plus this machine's Go toolchain, which must be the Dockerfile's GO_VERSION.
# buildah's storage is its own (under $NLD_CACHE/buildah), not the host's.
set -euo pipefail
out=${1:?usage: $0 OUTDIR}
repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${NLD_CACHE:-/var/cache/nodelocaldns-test}
mkdir -p "$out" "$cache/buildah"
exec 9>"$cache/buildah/.lock"
flock 9

bh=(buildah --root "$cache/buildah/storage" --runroot /run/nld-e2e-buildah --storage-driver overlay)
log() { echo "images: $*" >&2; }

# Debian bookworm, minbase: what debian:bookworm-slim is.
rootfs=$cache/debian-bookworm-minbase.tar
if [ ! -s "$rootfs" ]; then
	log "debootstrap bookworm (once, cached in $rootfs)"
	tmp=$(mktemp -d)
	debootstrap --variant=minbase bookworm "$tmp/root" http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1 ||
		{ tail -20 "$cache/debootstrap.log" >&2; rm -rf "$tmp"; exit 1; }
	rm -rf "$tmp/root/var/cache/apt/archives/"*.deb "$tmp/root/var/lib/apt/lists/"*
	tar -C "$tmp/root" -cf "$rootfs.tmp" .
	mv "$rootfs.tmp" "$rootfs"
	rm -rf "$tmp"
fi

have() { "${bh[@]}" inspect --type image "$1" >/dev/null 2>&1; }

debian=docker.io/library/debian:bookworm-slim
if ! have "$debian"; then
	c=$("${bh[@]}" from scratch)
	"${bh[@]}" add "$c" "$rootfs" / >/dev/null
	"${bh[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd bash "$c"
	"${bh[@]}" commit -q --rm "$c" "$debian" >/dev/null
fi

go_version=$(sed -n 's/^ARG GO_VERSION=//p' "$repo/Dockerfile")
host_go=$(go env GOVERSION)
if [ "go$go_version" != "$host_go" ]; then
	echo "images: the Dockerfile wants Go $go_version, this machine has $host_go" >&2
	exit 1
fi
golang=docker.io/library/golang:$go_version
if ! have "$golang"; then
	c=$("${bh[@]}" from --pull=never "$debian")
	"${bh[@]}" copy "$c" "$(go env GOROOT)" /usr/local/go >/dev/null
	# The official image has Debian's ca-certificates; this machine's bundle
	# is what its own go reaches the module proxy with.
	"${bh[@]}" copy "$c" /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt >/dev/null
	"${bh[@]}" config --env GOPATH=/go --env PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--workingdir /go "$c"
	"${bh[@]}" commit -q --rm "$c" "$golang" >/dev/null
fi

# Ours, from the Dockerfile as it is. --network host: the build stage's
# go mod download reaches the module proxy and the runtime stage's apt-get
# the Debian mirror, the same as this machine. buildah 1.28 does not set
# TARGETARCH, TARGETPLATFORM and BUILDPLATFORM as BuildKit does: passed here.
start=$(date +%s)
"${bh[@]}" bud -q --pull-never --isolation chroot --network host --layers \
	--build-arg TARGETARCH="$(go env GOARCH)" --build-arg TARGETPLATFORM="linux/$(go env GOARCH)" --build-arg BUILDPLATFORM="linux/$(go env GOARCH)" \
	--build-arg VERSION=e2e --build-arg REVISION="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)" \
	-t localhost/nodelocaldns:e2e -f "$repo/Dockerfile" "$repo" >/dev/null
log "nodelocaldns image from the Dockerfile in $(($(date +%s) - start)) s"

"${bh[@]}" bud -q --pull-never --isolation chroot --network host --layers \
	-t localhost/client:e2e -f "$repo/test/e2e/images/client/Containerfile" "$repo/test/e2e/images/client" >/dev/null

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The stock node-local-dns, from the oracle binary: the image the migration
# test (TestMigrationFromStock) starts from and rolls back to.
oracles=${NODELOCALDNS_ORACLES:-$repo/../shared/oracles}
rm -f "$out/node-cache.tar"
stock=
if [ -s "$oracles/node-cache.xz" ] && [ -s "$oracles/node-cache.sha256" ]; then
	mkdir "$tmp/node-cache"
	xz -dc "$oracles/node-cache.xz" >"$tmp/node-cache/node-cache"
	chmod 0755 "$tmp/node-cache/node-cache"
	want=$(awk '{print $1; exit}' "$oracles/node-cache.sha256")
	got=$(sha256sum "$tmp/node-cache/node-cache" | awk '{print $1}')
	if [ "$got" != "$want" ]; then
		echo "images: $oracles/node-cache.xz unpacks to sha256 $got, node-cache.sha256 says $want" >&2
		exit 1
	fi
	"${bh[@]}" bud -q --pull-never --isolation chroot --network host --layers \
		-t localhost/node-cache:e2e -f "$repo/test/e2e/images/node-cache/Containerfile" "$tmp/node-cache" >/dev/null
	rm -rf "$tmp/node-cache"
	stock=node-cache
else
	log "no stock node-local-dns in $oracles (node-cache.xz, node-cache.sha256; see its README.md): no localhost/node-cache:e2e, the migration test will skip (fail under CI=true)"
fi
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$tmp/pause" ./test/e2e/images/pause)
c=$("${bh[@]}" from scratch)
"${bh[@]}" copy "$c" "$tmp/pause" /pause >/dev/null
"${bh[@]}" config --entrypoint '["/pause"]' "$c"
"${bh[@]}" commit -q --rm "$c" localhost/pause:e2e >/dev/null

coredns=$("$repo/test/coredns/build.sh")
c=$("${bh[@]}" from scratch)
"${bh[@]}" copy "$c" "$coredns" /coredns >/dev/null
"${bh[@]}" config --entrypoint '["/coredns"]' "$c"
"${bh[@]}" commit -q --rm "$c" localhost/coredns:e2e >/dev/null

for img in nodelocaldns pause coredns client $stock; do
	rm -f "$out/$img.tar"
	"${bh[@]}" push -q "localhost/$img:e2e" "docker-archive:$out/$img.tar:localhost/$img:e2e" >/dev/null
done
# The image's bill of materials, beside it (cmd/nodelocaldns-sbom: the
# modules from the binary's build information, the Debian packages from
# the image's dpkg status).
(cd "$repo" && go run ./cmd/nodelocaldns-sbom -image "$out/nodelocaldns.tar" -name localhost/nodelocaldns:e2e) >"$out/nodelocaldns.spdx.json"
log "images in $out (nodelocaldns.spdx.json: $(grep -c '"SPDXID"' "$out/nodelocaldns.spdx.json") SPDX elements)"
