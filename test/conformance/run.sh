#!/usr/bin/env bash
# make conformance: Kubernetes' own DNS specs ([sig-network] DNS, and the
# Services specs about ExternalName) from the e2e suite of k8s.io/kubernetes,
# run on the e2e cluster (test/e2e/cluster.sh, docs/e2e.md) with every pod
# resolving through a node cache. docs/conformance.md says what runs and
# what it found; its results section is written here (test/conformance/report).
#
# The runs, one cluster, one after the other (NLD_CONFORMANCE_RUNS, default
# "ours autopath stock"):
#   ours      deploy/daemonset.yaml as docs/deploy.md renders it
#   autopath  the same with its "- -autopath" line on (and the token)
#   kube-dns  the same with its "- -external-upstream=kube-dns" line on:
#             every name to kube-dns (not in the default list: run it with
#             NLD_CONFORMANCE_RUNS, e.g. for the [Serial] ConfigMap specs)
#   stock     the stock node-local-dns: the Kubernetes reference manifest with
#             the oracle binary's image (as make e2e's migration test has it);
#             without the oracle left out, said so (under CI=true: fails)
#
# Built outside the cluster, cached in /var/cache/nodelocaldns-test:
# e2e.test and agnhost (test/kube/build.sh), the images (test/e2e/images.sh,
# test/conformance/images.sh). Nothing is pulled: KUBE_TEST_REPO_LIST names
# the suite's images localhost/..., built here and imported into the node.
#
# Environment:
#   NLD_CONFORMANCE_RUNS   the runs, in order (above)
#   NLD_CONFORMANCE_FOCUS  --ginkgo.focus (default: the DNS and ExternalName
#                          specs); NLD_CONFORMANCE_SKIP --ginkgo.skip
#   NLD_CONFORMANCE_DOC    the document to write the results into (default
#                          docs/conformance.md; "" prints them instead)
#   NLD_E2E_LOCK           a lock file: held (flock) only while the cluster
#                          is up, so builds run beside other clusters
# The runs' logs and JUnit reports: test/conformance/out/RUN/.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
t0=$(date +%s)
log_prefix=conformance
logs_dest=$repo/test/conformance/out/cluster-logs
# The cluster: cluster_prepare, cluster_up, deploy_nodelocaldns, innode, k.
source test/e2e/cluster.sh

runs=${NLD_CONFORMANCE_RUNS:-ours autopath stock}
for r in $runs; do
	case $r in ours | autopath | kube-dns | stock) ;; *) echo "conformance: unknown run '$r' (ours, autopath, kube-dns, stock)" >&2; exit 2 ;; esac
done
focus=${NLD_CONFORMANCE_FOCUS:-'\[sig-network\] DNS|\[sig-network\] Services .*ExternalName'}
skip=${NLD_CONFORMANCE_SKIP:-}
doc=${NLD_CONFORMANCE_DOC-docs/conformance.md}
out=$repo/test/conformance/out
rm -rf "$out"
mkdir -p "$out"

cluster_prepare
log "building or reusing e2e.test and agnhost $kube_version (test/kube/build.sh)"
suite=$(test/kube/build.sh -v "$kube_version" e2e.test agnhost)

# The suite's image names: its own registries, but for the two its DNS and
# Service specs use, which are here under localhost/ (images.sh checks each
# name against e2e.test --list-images).
cat >"$work/repo-list.yaml" <<EOF
promoterE2eRegistry: localhost/e2e-test-images
gcRegistry: localhost/k8s
EOF
log "images (test/e2e/images.sh, test/conformance/images.sh)"
test/e2e/images.sh "$work/images"
test/conformance/images.sh "$work/images" "$suite/agnhost" "$suite/e2e.test" "$work/repo-list.yaml" >"$work/suite-images"
sed 's/^/conformance: image /' "$work/suite-images" >&2
if [[ " $runs " == *" stock "* ]] && [ ! -s "$work/images/node-cache.tar" ]; then
	# As make e2e's migration test: without the oracle the comparison is
	# left out, said so, and under CI=true that fails.
	missing="the stock run needs the oracle binary (${NODELOCALDNS_ORACLES:-$repo/../shared/oracles}/node-cache.xz; see its README.md)"
	if [ "${CI:-}" = true ]; then echo "conformance: $missing" >&2; exit 1; fi
	log "no stock run: $missing"
	runs=$(tr ' ' '\n' <<<"$runs" | grep -vx stock | tr '\n' ' ')
	[ -n "${runs// /}" ] || { echo "conformance: nothing left to run" >&2; exit 1; }
fi
cp "$suite/e2e.test" "$work/e2e.test"
log "built in $(($(date +%s) - t0)) s"

if [ -n "${NLD_E2E_LOCK:-}" ]; then
	log "waiting for $NLD_E2E_LOCK"
	exec 8>"$NLD_E2E_LOCK"
	flock 8
	log "holding $NLD_E2E_LOCK"
fi
cluster_up

# One run of the suite in the node's namespaces: the API server is at the
# node's address, and its proxy reaches the pods' test web servers.
suiterun() { # name what-is-deployed
	local name=$1 dir=$out/$1 s rc
	mkdir -p "$dir"
	s=$(date +%s)
	set +e
	innode env KUBE_TEST_REPO_LIST="$work/repo-list.yaml" "$work/e2e.test" \
		--kubeconfig="$KUBECONFIG" --provider=local --kubectl-path="$bin/kubectl" \
		--ginkgo.focus="$focus" ${skip:+--ginkgo.skip="$skip"} \
		--ginkgo.no-color --ginkgo.timeout=3h --report-dir="$dir" \
		>"$dir/e2e.log" 2>&1
	rc=$?
	set -e
	# The cache's own count of what it answered in this run (a new process
	# per deployment; ours exports CoreDNS's names too): the specs' queries
	# went through it.
	innode curl -sf "http://$localdns:9253/metrics" >"$dir/metrics.txt" || true
	{
		echo "deployed: $2"
		grep -E '^Ran [0-9]+ of [0-9]+ Specs|^(SUCCESS|FAIL)! .* Passed' "$dir/e2e.log" || echo "no ginkgo summary (e2e.test exit $rc): see its log"
		echo "suite time: $(($(date +%s) - s)) s (e2e.test exit $rc)"
		awk '/^coredns_dns_requests_total/ {n += $NF} /^nodelocaldns_autopath_answers_total/ {a = $NF}
			END {printf "the cache answered %d queries (coredns_dns_requests_total)", n; if (a != "") printf ", %d by autopath (nodelocaldns_autopath_answers_total)", a; print ""}' "$dir/metrics.txt"
	} >"$dir/run.txt"
	sed "s/^/conformance: $name: /" "$dir/run.txt" >&2
	[ -s "$dir/junit_01.xml" ] || { tail -30 "$dir/e2e.log" >&2; echo "conformance: $name: no JUnit report" >&2; exit 1; }
}

stock_yaml() {
	sed -e "s/__PILLAR__LOCAL__DNS__/$localdns/g; s/__PILLAR__DNS__DOMAIN__/$domain/g; s/__PILLAR__DNS__SERVER__/$kubedns/g" \
		-e "s|image: registry.k8s.io/dns/k8s-dns-node-cache:.*|image: localhost/node-cache:e2e|" \
		test/e2e/manifests/nodelocaldns.yaml >"$work/stock.yaml"
}
ours_up=
reports=()
for r in $runs; do
	case $r in
	ours)
		deploy_nodelocaldns localhost/nodelocaldns:e2e
		ours_up=1
		what="nodelocaldns, deploy/daemonset.yaml (docs/deploy.md, iptables mode)"
		;;
	autopath)
		deploy_nodelocaldns localhost/nodelocaldns:e2e autopath
		ours_up=1
		what="nodelocaldns, deploy/daemonset.yaml with -autopath on"
		;;
	kube-dns)
		deploy_nodelocaldns localhost/nodelocaldns:e2e kube-dns
		ours_up=1
		what="nodelocaldns, deploy/daemonset.yaml with -external-upstream=kube-dns on"
		;;
	stock)
		if [ -n "$ours_up" ]; then
			k delete -f "$work/nodelocaldns.yaml" --wait=true >/dev/null
			k -n kube-system wait --for=delete pod -l k8s-app=nodelocaldns --timeout=120s >/dev/null 2>&1 || true
			ours_up=
		fi
		stock_yaml
		k apply -f "$work/stock.yaml" >/dev/null
		k -n kube-system rollout status ds/node-local-dns --timeout=180s >/dev/null
		what="the stock node-local-dns, the Kubernetes reference manifest (test/e2e/manifests/nodelocaldns.yaml), image from ../shared/oracles/node-cache.xz"
		;;
	esac
	log "$r: deployed ($what); running the suite"
	suiterun "$r" "$what"
	reports+=("$r=$out/$r")
	if [ "$r" = stock ]; then
		k delete -f "$work/stock.yaml" --wait=true >/dev/null
	fi
done
log "runs done in $(($(date +%s) - t0)) s"

# The results (into $doc, or to stdout when it is empty) and the outcome:
# the report's exit status is the run's.
go run ./test/conformance/report -doc "${doc:--}" -focus "$focus" "${reports[@]}"
log "all specs as expected (results in ${doc:-the output above})"
