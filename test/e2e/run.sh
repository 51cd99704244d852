#!/usr/bin/env bash
# make e2e: a real single-node Kubernetes cluster on this machine, nodelocaldns
# deployed on it from deploy/daemonset.yaml, and the tests of test/e2e run
# against it. docs/e2e.md describes the layout; in short:
#
#   netns nld-e2e-up-PID    the stand-in upstream (CoreDNS with a hosts zone)
#                           on 10.200.0.1 and, for the stub domain, 10.200.0.3
#   netns nld-e2e-node-PID  the node, 10.200.0.2: etcd, kube-apiserver,
#                           kube-controller-manager, kube-scheduler,
#                           containerd, kubelet, kube-proxy (iptables), the
#                           pods' bridge cni0 10.244.0.1/24, in a mount
#                           namespace of its own (node.sh)
#
# The bring-up and teardown are test/e2e/cluster.sh's, which make conformance
# (test/conformance/run.sh) shares. The host's own network, iptables, /run
# and mounts are not touched; what is left on the host (cgroups under
# /nld-e2e-PID, the work directory, the two namespaces) is removed on exit,
# whatever the outcome (trap). Root only.
#
# Before ours, the migration (docs/migration.md): the stock node-local-dns
# from the Kubernetes reference manifest (manifests/nodelocaldns.yaml, its
# image built from the oracle binary by images.sh), then only image: changed
# to ours, then back; TestMigrationFromStock runs alone against it.
#
# Environment: NLD_E2E_KEEP=1 keeps the cluster up after the tests (until
# Enter); NLD_E2E_RUN=REGEXP is passed to go test -run (the migration runs
# when it matches TestMigrationFromStock); NLD_E2E_PROXY_MODE=nftables runs
# kube-proxy in its nftables mode instead of iptables (docs/e2e.md).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
t0=$(date +%s)
log_prefix=e2e
# The cluster: cluster_prepare, cluster_up, deploy_nodelocaldns, innode, k.
source test/e2e/cluster.sh
cluster_prepare

log "images (test/e2e/images.sh: buildah, no Docker engine)"
test/e2e/images.sh "$work/images"
# logind's part in the kubelet's graceful node shutdown (node.sh).
go build -o "$work/logind" ./test/e2e/logind

cluster_up

# The tests: compiled here, run in the node's namespaces, in two rounds.
go test -c -o "$work/e2e.test" ./test/e2e
runtests() { # go test flags...
	set +e
	innode env KUBECONFIG="$KUBECONFIG" NLD_E2E_NODUMMY="${NLD_E2E_NODUMMY:-}" NLD_E2E_KUBECTL="$bin/kubectl" NLD_E2E_WORK="$work" \
		NLD_E2E_KUBEDNS="$kubedns" NLD_E2E_LOCALDNS="$localdns" NLD_E2E_STUB="$stub_ip" \
		NLD_E2E_MANIFEST="$work/nodelocaldns.yaml" NLD_E2E_IMAGE=localhost/nodelocaldns:e2e \
		NLD_E2E_STOCK_MANIFEST="$work/stock.yaml" NLD_E2E_STOCK_IMAGE="$stock_image" NLD_E2E_STOCK_MISSING="$stock_missing" \
		NLD_E2E_PROXY_MODE="$proxy_mode" \
		"$work/e2e.test" -test.v -test.count=1 -test.timeout=20m "$@" 2>&1 | tee -a "$work/logs/tests.log"
	local rc=${PIPESTATUS[0]}
	set -e
	return "$rc"
}
rc=0

# The migration: the stock node-local-dns as distributions deploy it, the
# reference manifest with the Kubernetes documentation's iptables-mode sed
# (kubernetes.io, "Using NodeLocal DNSCache") and the oracle's image in place
# of registry.k8s.io's. TestMigrationFromStock changes its image: to ours and
# back under lookups, then deletes it.
stock_image=localhost/node-cache:e2e stock_missing=
if [ -z "${NLD_E2E_RUN:-}" ] || grep -qE -- "$NLD_E2E_RUN" <<<TestMigrationFromStock; then
	if [ -s "$work/images/node-cache.tar" ]; then
		sed -e "s/__PILLAR__LOCAL__DNS__/$localdns/g; s/__PILLAR__DNS__DOMAIN__/$domain/g; s/__PILLAR__DNS__SERVER__/$kubedns/g" \
			-e "s|image: registry.k8s.io/dns/k8s-dns-node-cache:.*|image: $stock_image|" \
			test/e2e/manifests/nodelocaldns.yaml >"$work/stock.yaml"
		k apply -f "$work/stock.yaml" >/dev/null
		k -n kube-system rollout status ds/node-local-dns --timeout=180s >/dev/null
		log "stock node-local-dns ready (the reference manifest, $stock_image)"
	else
		stock_missing="no stock image: the oracle binary is not in ${NODELOCALDNS_ORACLES:-$repo/../shared/oracles} (node-cache.xz; see its README.md, or set NODELOCALDNS_ORACLES)"
		log "$stock_missing"
	fi
	m0=$(date +%s)
	runtests -test.run '^TestMigrationFromStock$' || rc=$?
	log "migration done in $(($(date +%s) - m0)) s"
fi

# nodelocaldns as shipped (deploy_nodelocaldns: deploy/daemonset.yaml with
# docs/deploy.md's iptables-mode sed).
deploy_nodelocaldns localhost/nodelocaldns:e2e
log "nodelocaldns ready (bring-up $(($(date +%s) - t0)) s)"

runtests -test.skip '^TestMigrationFromStock$' ${NLD_E2E_RUN:+-test.run "$NLD_E2E_RUN"} || rc=$?
passed=$(grep -c '^--- PASS' "$work/logs/tests.log" || true)
failed=$(grep -c '^--- FAIL' "$work/logs/tests.log" || true)
skipped=$(grep -cE '^ *--- SKIP' "$work/logs/tests.log" || true)
grep -o 'migration: .*' "$work/logs/tests.log" | sed 's/^/e2e: /' >&2 || true
log "$passed passed, $failed failed, $skipped skipped (total $(($(date +%s) - t0)) s)"
if [ -n "${NLD_E2E_KEEP:-}" ]; then
	log "cluster kept: KUBECONFIG=$KUBECONFIG; nsenter --net=/run/netns/$node_ns --mount=/proc/$node_pid/ns/mnt; Enter to tear down"
	read -r _
fi
exit "$rc"
