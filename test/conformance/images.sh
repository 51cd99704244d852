#!/usr/bin/env bash
# The images the Kubernetes e2e suite's DNS and ExternalName specs run, made
# without a Docker engine or a registry and written as docker-archive
# tarballs for the e2e node's `ctr images import`:
#
#   test/conformance/images.sh OUTDIR AGNHOST E2E_TEST REPO_LIST
#
# AGNHOST is the agnhost binary and E2E_TEST the suite (both from
# test/kube/build.sh), REPO_LIST the KUBE_TEST_REPO_LIST file the suite runs
# with (run.sh writes it): the images are named as the suite asks for them
# under that list, and each name is checked against `e2e.test --list-images`
# (a Kubernetes version that moves an image's tag fails here, not in a pod
# stuck in ErrImagePull).
#
#   agnhost            images/agnhost/Containerfile
#   glibc-dns-testing  images/glibc-dns-testing/Containerfile
#   busybox            images/busybox/Containerfile
#   pause              localhost/pause:e2e (test/e2e/images.sh), renamed
#
# test/e2e/images.sh must have run first: the Debian base and the pause
# image are its. buildah's storage and lock are its too.
set -euo pipefail
out=${1:?usage: $0 OUTDIR AGNHOST E2E_TEST REPO_LIST} agnhost=${2:?} e2etest=${3:?} repolist=${4:?}
repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${NLD_CACHE:-/var/cache/nodelocaldns-test}
mkdir -p "$out"
exec 9>"$cache/buildah/.lock"
flock 9
bh=(buildah --root "$cache/buildah/storage" --runroot /run/nld-e2e-buildah --storage-driver overlay)
log() { echo "conformance images: $*" >&2; }

# The names, v1.37.2's test/utils/image/manifest.go under the repo list.
listed=$(KUBE_TEST_REPO_LIST=$repolist "$e2etest" --list-images)
name() { # image: its one name in the list, or fail
	local n
	n=$(grep -E "^localhost/.*/$1:[^/]*$" <<<"$listed" || true)
	if [ "$(wc -l <<<"$n")" != 1 ] || [ -z "$n" ]; then
		echo "conformance images: e2e.test --list-images names '$1' as: ${n:-nothing}" >&2
		exit 1
	fi
	echo "$n"
}
agnhost_name=$(grep -E '^localhost/.*/agnhost:2\.66\.1$' <<<"$listed" || true)
[ -n "$agnhost_name" ] || { echo "conformance images: no agnhost:2.66.1 in e2e.test --list-images (a new suite: check the agnhost it wants)" >&2; exit 1; }
glibc_name=$(name glibc-dns-testing)
busybox_name=$(name busybox)
pause_name=$(name pause)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
coredns=$("$repo/test/coredns/build.sh")
build() { # name containerfile-dir [source=name-in-context]...
	local n=$1 dir=$2 ctx=$tmp/$RANDOM f
	shift 2
	mkdir "$ctx"
	for f in "$@"; do cp "${f%%=*}" "$ctx/${f#*=}"; done
	"${bh[@]}" bud -q --pull-never --isolation chroot --network host --layers \
		-t "$n" -f "$dir/Containerfile" "$ctx" >/dev/null
}
start=$(date +%s)
build "$agnhost_name" "$repo/test/conformance/images/agnhost" "$agnhost=agnhost" "$coredns=coredns"
build "$glibc_name" "$repo/test/conformance/images/glibc-dns-testing" "$coredns=coredns"
build "$busybox_name" "$repo/test/conformance/images/busybox"
"${bh[@]}" tag localhost/pause:e2e "$pause_name"
i=0
for n in "$agnhost_name" "$glibc_name" "$busybox_name" "$pause_name"; do
	i=$((i + 1))
	rm -f "$out/conformance-$i.tar"
	"${bh[@]}" push -q "$n" "docker-archive:$out/conformance-$i.tar:$n" >/dev/null
	echo "$n"
done
log "built in $(($(date +%s) - start)) s"
