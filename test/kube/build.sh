#!/usr/bin/env bash
# Build Kubernetes components from the Go module proxy, cached by version.
#
#   test/kube/build.sh [-v VERSION] COMPONENT...
#
# COMPONENT is a cmd/ name of k8s.io/kubernetes (kube-apiserver, kubelet,
# kube-proxy, kube-controller-manager, kube-scheduler, kubectl), or one of
# what the conformance run needs (make conformance, docs/conformance.md):
# e2e.test (`go test -c k8s.io/kubernetes/test/e2e`, the suite) and agnhost
# (test/images/agnhost, the suite's test binary for its pods). Each binary
# goes to $NLD_CACHE/kube-VERSION/COMPONENT (default cache
# /var/cache/nodelocaldns-test) and is built only when missing, so a second
# run does not rebuild. Prints the cache directory on stdout.
#
# k8s.io/kubernetes cannot be `go install`ed (its go.mod replaces the staging
# modules with ./staging/...), so a throwaway module requires it and pins
# every staging module to the matching v0.X.Y.
set -euo pipefail

version=v1.37.2
if [ "${1:-}" = "-v" ]; then version=$2; shift 2; fi
[ $# -gt 0 ] || { echo "usage: $0 [-v VERSION] COMPONENT..." >&2; exit 2; }

cache=${NLD_CACHE:-/var/cache/nodelocaldns-test}
out=$cache/kube-$version
mkdir -p "$out"
# Two callers (the e2e and a test that needs kube-apiserver) may build at once.
exec 9>"$out/.lock"
flock 9

missing=()
for c in "$@"; do
	[ -x "$out/$c" ] || missing+=("$c")
done
if ((${#missing[@]} == 0)); then echo "$out"; exit 0; fi

minor=v0.${version#v1.}

mod=$(mktemp -d)
trap 'rm -rf "$mod"' EXIT
cd "$mod"
# The staging modules are the ones k8s.io/kubernetes's own go.mod replaces
# with ./staging/src/...: read them from it (each release adds some, e.g.
# cri-streaming and streaming in v1.37), and pin each to v0.X.Y.
kgomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$kgomod")
((${#staging[@]} > 0)) || { echo "no staging modules in $kgomod" >&2; exit 1; }
{
	echo "module kubebuild"
	echo
	echo "go 1.26"
	echo
	echo "require k8s.io/kubernetes $version"
	for s in "${staging[@]}"; do echo "replace $s => $s $minor"; done
	# tool directives (not imports): kubectl has no cmd/kubectl/app package,
	# and a main package cannot be imported; tidy keeps a tool's packages.
	for c in "${missing[@]}"; do
		case $c in
		e2e.test) ;;
		agnhost) echo "tool k8s.io/kubernetes/test/images/agnhost" ;;
		*) echo "tool k8s.io/kubernetes/cmd/$c" ;;
		esac
	done
} >go.mod
# The suite is a test package: tidy keeps what an import of it needs (its
# _test.go imports are in the package e2e itself, test/e2e/e2e.go).
if [[ " ${missing[*]} " == *" e2e.test "* ]]; then
	printf 'package kubebuild\n\nimport _ "k8s.io/kubernetes/test/e2e"\n' >deps.go
fi
# A staging module a version does not have on the proxy makes tidy fail
# with "unknown revision": drop that replace and try again.
for _ in 1 2 3 4 5; do
	if err=$(go mod tidy 2>&1); then break; fi
	bad=$(grep -o 'k8s.io/[a-z-]*@'"$minor"': .*unknown revision' <<<"$err" | sed 's/@.*//' | sort -u || true)
	if [ -z "$bad" ]; then echo "$err" >&2; exit 1; fi
	for b in $bad; do sed -i "\#^replace $b => #d" go.mod; done
done
for c in "${missing[@]}"; do
	start=$(date +%s)
	ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version"
	case $c in
	e2e.test) CGO_ENABLED=0 go test -c -trimpath -ldflags "$ldflags" -o "$out/$c.tmp" k8s.io/kubernetes/test/e2e ;;
	agnhost) CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/$c.tmp" k8s.io/kubernetes/test/images/agnhost ;;
	*) CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/$c.tmp" "k8s.io/kubernetes/cmd/$c" ;;
	esac
	mv "$out/$c.tmp" "$out/$c"
	echo "built $c $version in $(($(date +%s) - start)) s" >&2
done
echo "$out"
