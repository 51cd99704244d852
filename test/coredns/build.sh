#!/usr/bin/env bash
# Build CoreDNS from the Go module proxy, cached by version: the oracle for
# Corefile behaviour in tests and the kube-dns of the e2e cluster.
#
#   test/coredns/build.sh [VERSION]      (default v1.15.0, what bench/ runs)
#
# Prints the binary's path: $NLD_CACHE/coredns-VERSION (default cache
# /var/cache/nodelocaldns-test). Built only when missing.
set -euo pipefail
version=${1:-v1.15.0}
cache=${NLD_CACHE:-/var/cache/nodelocaldns-test}
bin=$cache/coredns-$version
mkdir -p "$cache"
exec 9>"$bin.lock"
flock 9
if [ ! -x "$bin" ]; then
	gobin=$(mktemp -d)
	trap 'rm -rf "$gobin"' EXIT
	start=$(date +%s)
	CGO_ENABLED=0 GOBIN=$gobin go install -trimpath -ldflags='-s -w' "github.com/coredns/coredns@$version"
	mv "$gobin/coredns" "$bin"
	echo "built coredns $version in $(($(date +%s) - start)) s" >&2
fi
echo "$bin"
