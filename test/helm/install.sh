#!/usr/bin/env bash
# Helm, pinned, built from the Go module proxy (as .ci/run installs
# staticcheck): test/helm/install.sh 3|4 prints the path of that Helm's
# binary, building it first when missing (a few minutes; then reused).
#
# Helm 3's version and default Kubernetes version are link-time settings
# of its Makefile (go install does not set them: `helm template` would
# assume Kubernetes v1.20); they are set here as its release builds set
# them. Helm 4 reads both from its build information.
set -euo pipefail
helm3=v3.22.0 # k8s.io/client-go v0.37.0 in its go.mod
helm4=v4.3.2
case ${1:-} in
3) v=$helm3 pkg=helm.sh/helm/v3
   ldflags="-s -w -X $pkg/internal/version.version=$v -X $pkg/pkg/lint/rules.k8sVersionMajor=1 -X $pkg/pkg/lint/rules.k8sVersionMinor=37 -X $pkg/pkg/chartutil.k8sVersionMajor=1 -X $pkg/pkg/chartutil.k8sVersionMinor=37" ;;
4) v=$helm4 pkg=helm.sh/helm/v4
   ldflags="-s -w -X $pkg/internal/version.version=$v" ;;
*) echo "usage: $0 3|4" >&2; exit 2 ;;
esac
dir="$(go env GOPATH)/helm/$v"
if [ ! -x "$dir/helm" ]; then
	echo "helm: building $pkg/cmd/helm@$v into $dir" >&2
	GOBIN=$dir CGO_ENABLED=0 go install -trimpath -ldflags "$ldflags" "$pkg/cmd/helm@$v"
fi
echo "$dir/helm"
