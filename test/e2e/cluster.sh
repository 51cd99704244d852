# The e2e cluster, shared by test/e2e/run.sh (make e2e) and
# test/conformance/run.sh (make conformance): sourced, not run. It defines
#
#   cluster_prepare    root check, Debian packages, the Kubernetes and CoreDNS
#                      builds ($bin, $coredns), the work directory ($work) and
#                      the teardown trap
#   cluster_up         the two namespaces, the stand-in upstream, the node
#                      (node.sh: etcd, control plane, containerd with every
#                      $work/images/*.tar imported, kubelet, kube-proxy) and
#                      kube-dns; sets $kubedns. The caller puts the images in
#                      $work/images first.
#   deploy_nodelocaldns IMAGE [autopath|kube-dns]
#                      deploy/daemonset.yaml rendered by docs/deploy.md's
#                      iptables-mode sed into $work/nodelocaldns.yaml (with
#                      autopath: its "- -autopath" line uncommented and
#                      deploy/autopath/rbac.yaml applied, as its
#                      comment says; the manifest mounts the token it needs;
#                      with kube-dns: its "- -external-upstream=kube-dns"),
#                      applied and rolled out
#   innode CMD...      CMD in the node's network and mount namespaces
#   k ARGS...          kubectl in the node
#   log MSG            "$log_prefix: [Ns] MSG" on stderr
#
# The caller sets repo (the repository), t0 (its start) and log_prefix, and
# runs under set -euo pipefail. docs/e2e.md describes the layout.
log() { echo "$log_prefix: [$(($(date +%s) - t0))s] $*" >&2; }

# Teardown (the EXIT trap cluster_prepare sets): whatever the outcome, the
# node and everything it started go; logs are kept on failure.
teardown() {
	local rc=$?
	set +e
	trap - EXIT INT TERM
	log "teardown"
	if [ -n "$node_pid" ]; then
		kill "$node_pid" 2>/dev/null
		# node.sh stops its children (kubelet, containerd, ...) and returns.
		for _ in $(seq 100); do kill -0 "$node_pid" 2>/dev/null || break; sleep 0.2; done
	fi
	# Container processes outlive containerd (their shims hold them):
	# everything still in the node's cgroups or namespace goes.
	for c in /sys/fs/cgroup/*/"$cgroot"; do
		[ -d "$c" ] || continue
		find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | xargs -r kill -9 2>/dev/null
	done
	if [ -e "/run/netns/$node_ns" ]; then
		ip netns pids "$node_ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
	fi
	[ -n "$up_pid" ] && kill "$up_pid" 2>/dev/null
	# A cgroup goes once its last process has exited: retry for 10 s.
	for _ in $(seq 50); do
		left=
		for c in /sys/fs/cgroup/*/"$cgroot"; do
			[ -d "$c" ] || continue
			find "$c" -depth -type d -exec rmdir {} + 2>/dev/null
			[ -d "$c" ] && left=$c
		done
		[ -z "$left" ] && break
		sleep 0.2
	done
	[ -n "$left" ] && echo "$log_prefix: cgroup $left not removed" >&2
	ip netns del "$node_ns" 2>/dev/null
	ip netns del "$up_ns" 2>/dev/null
	if [ "${NLD_E2E_KEEP_LOGS:-}" != "" ] || [ "$rc" != 0 ]; then
		mkdir -p "$logs_dest" && cp -r "$work/logs/." "$logs_dest/" 2>/dev/null
		cp -rL "$work/pod-logs" "$logs_dest/" 2>/dev/null
		log "logs copied to $logs_dest"
	fi
	# Mounts made in the node's mount namespace died with it; nothing of
	# the work directory is mounted on the host.
	rm -rf "$work"
	log "done, exit $rc"
	exit "$rc"
}

cluster_prepare() {
: "${logs_dest:=$repo/test/e2e/logs}"
[ "$(id -u)" = 0 ] || { echo "$log_prefix: must run as root (namespaces, cgroups, iptables)" >&2; exit 1; }
proxy_mode=${NLD_E2E_PROXY_MODE:-iptables}
case $proxy_mode in
iptables | nftables) ;;
*) echo "$log_prefix: NLD_E2E_PROXY_MODE=$proxy_mode: iptables or nftables" >&2; exit 2 ;;
esac
# What Debian provides (the CI machine starts bare).
need=()
# kube-proxy's nftables mode runs the nft binary.
[ "$proxy_mode" = nftables ] && { command -v nft >/dev/null || need+=(nftables); }
for tool in etcd:etcd-server containerd:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins \
	buildah:buildah debootstrap:debootstrap iptables:iptables conntrack:conntrack openssl:openssl \
	curl:curl dig:dnsutils dbus-daemon:dbus-daemon; do
	p=${tool%%:*}
	if [[ $p == /* ]]; then [ -e "$p" ] || need+=("${tool#*:}"); else command -v "$p" >/dev/null || need+=("${tool#*:}"); fi
done
if ((${#need[@]})); then
	log "installing ${need[*]}"
	policy=/usr/sbin/policy-rc.d added=
	# Debian would start etcd and containerd as services: the e2e runs its own.
	if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && added=1; fi
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
	if [ -n "$added" ]; then rm -f "$policy"; fi
fi

# The kernel's facts, printed once: what the overrides below are for.
cgroupfs=$(stat -fc %T /sys/fs/cgroup)
log "kernel $(uname -r), /sys/fs/cgroup is $cgroupfs ($([ "$cgroupfs" = cgroup2fs ] && echo v2 || echo v1))"

kube_version=${NLD_KUBE_VERSION:-v1.37.2}
log "building or reusing Kubernetes $kube_version (test/kube/build.sh), CoreDNS (test/coredns/build.sh)"
bin=$(test/kube/build.sh -v "$kube_version" kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
coredns=$(test/coredns/build.sh)

id=$$
work=$(mktemp -d /var/tmp/nld-e2e.XXXXXX)
node_ns=nld-e2e-node-$id up_ns=nld-e2e-up-$id
cgroot=nld-e2e-$id
node_pid= up_pid=

trap teardown EXIT
trap 'exit 130' INT TERM

# Addresses: all private, all inside the two namespaces created here.
export NODE_IP=10.200.0.2 NODE_NAME=node1 SERVICE_CIDR=10.96.0.0/16 POD_CIDR=10.244.0.0/16
up_ip=10.200.0.1 stub_ip=10.200.0.3
kubedns_ip=10.96.0.10 localdns=169.254.20.10 domain=cluster.local

}

cluster_up() {
log "namespaces $node_ns, $up_ns"
ip netns add "$node_ns"
ip netns add "$up_ns"
ip link add nld-e2e-$id type veth peer name eth0 netns "$node_ns"
ip link set nld-e2e-$id netns "$up_ns"
ip -n "$up_ns" link set lo up
ip -n "$up_ns" link set "nld-e2e-$id" name eth0
ip -n "$up_ns" addr add "$up_ip/24" dev eth0
ip -n "$up_ns" addr add "$stub_ip/24" dev eth0
ip -n "$up_ns" link set eth0 up
ip -n "$node_ns" link set lo up
ip -n "$node_ns" addr add "$NODE_IP/24" dev eth0
ip -n "$node_ns" link set eth0 up
# The node's default route: Service IPs need one before kube-proxy's DNAT.
ip -n "$node_ns" route add default via "$up_ip"
# The way back to the pods (no masquerading on the bridge): kube-dns, a pod,
# forwards names outside the cluster to the node's resolver, as in a real
# cluster. Without it, while no node cache ran (the stock's rollout deletes
# before it creates), names outside the cluster failed through kube-dns.
ip -n "$up_ns" route add 10.244.0.0/16 via "$NODE_IP"
# No dummy link type on this kernel (netsetup: ErrNoDummy): the node gets a
# link named like the one the daemon makes, which it adopts as shipped
# (docs/e2e.md, "Overrides").
if ip -n "$node_ns" link add nodelocaldns type dummy 2>"$work/dummy.err"; then
	log "dummy links work here: the daemon creates its own link"
	ip -n "$node_ns" link del nodelocaldns
else
	log "override: no dummy link type ($(tr -d '\n' <"$work/dummy.err")); node link nodelocaldns made as type ifb"
	ip -n "$node_ns" link add nodelocaldns type ifb
	export NLD_E2E_NODUMMY
	NLD_E2E_NODUMMY=$(tr -d '\n' <"$work/dummy.err")
	mkdir -p "$work/logs"
	# The stock node-cache deletes the link on exit, adopted or not; the
	# next instance (the stock's or ours) could not make one here. Put it
	# back whenever it is gone, as a kernel with dummy links would let the
	# daemon do (killed with the namespace's processes on teardown).
	ip netns exec "$node_ns" bash -c 'while sleep 0.2; do
		ip link show nodelocaldns >/dev/null 2>&1 || { ip link add nodelocaldns type ifb && echo "$(date +%T.%N) link nodelocaldns made again"; }
	done' >"$work/logs/link-keeper.log" 2>&1 &
fi

# The stand-in upstream: the node's only resolver. external.e2e.example is
# the "external name"; stub.e2e.example is served only at $stub_ip, which
# the stub-domain test adds to the kube-dns ConfigMap; 8.8.8.8's PTR
# (dns.google.) is what the internet's DNS answers and the conformance
# suite's PTR spec asks first (docs/conformance.md).
mkdir -p "$work/up" "$work/logs"
cat >"$work/up/Corefile" <<EOC
e2e.example:53 {
    bind $up_ip
    hosts {
        192.0.2.80 external.e2e.example
    }
}
stub.e2e.example:53 {
    bind $stub_ip
    hosts {
        192.0.2.53 www.stub.e2e.example
    }
}
8.8.8.8.in-addr.arpa:53 {
    bind $up_ip
    template IN PTR {
        answer "{{ .Name }} 60 IN PTR dns.google."
    }
}
.:53 {
    bind $up_ip
    template ANY ANY {
        rcode NXDOMAIN
    }
}
EOC
ip netns exec "$up_ns" "$coredns" -conf "$work/up/Corefile" >"$work/logs/upstream.log" 2>&1 &
up_pid=$!
printf 'nameserver %s\n' "$up_ip" >"$work/resolv.conf"

log "certificates and kubeconfigs"
pki=$work/pki
mkdir -p "$pki"
(
	cd "$pki"
	openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=nld-e2e-ca 2>/dev/null
	openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null
	printf 'subjectAltName=IP:10.96.0.1,IP:%s,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.%s\n' \
		"$NODE_IP" "$domain" >apiserver.ext
	openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
		-extfile apiserver.ext -out apiserver.crt 2>/dev/null
	openssl genrsa -out sa.key 2048 2>/dev/null
	openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
)
tok() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
ADMIN_TOKEN=$(tok)
export ADMIN_TOKEN
kcm_token=$(tok) sched_token=$(tok) kubelet_token=$(tok) proxy_token=$(tok)
{
	echo "$ADMIN_TOKEN,admin,admin,system:masters"
	echo "$kcm_token,system:kube-controller-manager,kcm"
	echo "$sched_token,system:kube-scheduler,sched"
	echo "$kubelet_token,system:node:$NODE_NAME,kubelet,system:nodes"
	echo "$proxy_token,system:kube-proxy,kube-proxy"
} >"$work/tokens.csv"
kubeconfig() { # file token
	cat >"$1" <<EOK
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: https://$NODE_IP:6443
    certificate-authority: $pki/ca.crt
users:
- name: u
  user:
    token: $2
contexts:
- name: e2e
  context: {cluster: e2e, user: u}
current-context: e2e
EOK
}
kubeconfig "$work/admin.kubeconfig" "$ADMIN_TOKEN"
kubeconfig "$work/kcm.kubeconfig" "$kcm_token"
kubeconfig "$work/sched.kubeconfig" "$sched_token"
kubeconfig "$work/kubelet.kubeconfig" "$kubelet_token"
kubeconfig "$work/kube-proxy.kubeconfig" "$proxy_token"

mkdir -p "$work/cni" "$work/containerd" "$work/kubelet" "$work/pod-logs"
cat >"$work/cni/10-e2e.conflist" <<EOC
{
  "cniVersion": "0.4.0",
  "name": "e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$work/cni-ipam",
        "ranges": [[{"subnet": "10.244.0.0/24"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOC
cat >"$work/containerd.toml" <<EOC
version = 2
root = "$work/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  # Built by images.sh and imported by node.sh: nothing is pulled.
  sandbox_image = "localhost/pause:e2e"
  # Override: this machine withholds CAP_SYS_RESOURCE even from root, so no
  # process may lower its oom_score_adj (runc failed the sandbox with
  # "failed to update /proc/self/oom_score_adj: Permission denied" for the
  # kubelet's -998). Clamped to containerd's own instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$work/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
EOC
for c in /sys/fs/cgroup/*/; do
	[ -L "${c%/}" ] && continue
	mkdir -p "$c$cgroot" 2>/dev/null || true
done
cat >"$work/kubelet.yaml" <<EOC
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# Override: this kernel runs cgroup v1, which the kubelet refuses by default
# since v1.35 (KEP-5573).
failCgroupV1: false
cgroupDriver: cgroupfs
# Everything the kubelet creates is under this cgroup, removed on teardown.
cgroupRoot: /$cgroot
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
clusterDNS: [$localdns]
clusterDomain: $domain
resolvConf: /etc/resolv.conf
podLogsDir: $work/pod-logs
staticPodPath: ""
# The API server reaches the kubelet (exec, logs) inside the node's own
# namespace only; no kubelet client certificate is made.
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
failSwapOn: false
# The disk is shared with other work: no eviction for disk use.
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# ConfigMap volumes are updated on the pod's sync: 10 s instead of 1 min, so
# the stub-domain test waits less. The only timing change.
syncFrequency: 10s
# Graceful node shutdown as docs/deploy.md recommends it: 30 s for the
# node's pods, then 20 s for the critical ones (nodelocaldns is
# system-node-critical). Its logind is test/e2e/logind (node.sh).
shutdownGracePeriod: 50s
shutdownGracePeriodCriticalPods: 20s
EOC
cat >"$work/kube-proxy.yaml" <<EOC
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: $proxy_mode
clientConnection: {kubeconfig: $work/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
# The node is a network namespace: nf_conntrack_max and the conntrack
# timeouts are the host's and read-only here, so kube-proxy leaves them.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
EOC

log "node up (etcd, control plane, containerd, kubelet, kube-proxy in $proxy_mode mode)"
nsenter --net="/run/netns/$node_ns" unshare --mount --propagation slave \
	env -u NOTIFY_SOCKET test/e2e/node.sh "$work" "$bin" >"$work/logs/node.log" 2>&1 &
node_pid=$!
# Every later command in the node: its network and mount namespaces.
# (nsenter and unshare exec: $node_pid is node.sh itself.)
innode() { nsenter --net="/run/netns/$node_ns" --mount="/proc/$node_pid/ns/mnt" --wd="$repo" -- "$@"; }
deadline=$(($(date +%s) + 300))
until [ -e "$work/node-started" ]; do
	kill -0 "$node_pid" 2>/dev/null || { tail -20 "$work/logs/node.log" >&2; exit 1; }
	(($(date +%s) < deadline)) || { echo "$log_prefix: node not up after 300 s" >&2; exit 1; }
	sleep 0.5
done
export KUBECONFIG=$work/admin.kubeconfig
k() { innode "$bin/kubectl" "$@"; }
until k get node "$NODE_NAME" >/dev/null 2>&1; do
	(($(date +%s) < deadline)) || { echo "$log_prefix: node $NODE_NAME not registered" >&2; exit 1; }
	sleep 1
done
k wait --for=condition=Ready "node/$NODE_NAME" --timeout=120s >/dev/null
log "node $NODE_NAME Ready"

# kube-dns: CoreDNS with the kubernetes plugin behind the kube-dns Service.
k apply -f "$repo/test/e2e/manifests/kube-dns.yaml" >/dev/null
k -n kube-system rollout status deploy/coredns --timeout=180s >/dev/null
log "kube-dns ready at $kubedns_ip"

kubedns=$(k -n kube-system get svc kube-dns -o jsonpath='{.spec.clusterIP}')
}

# nodelocaldns, deploy/daemonset.yaml with docs/deploy.md's iptables-mode
# substitutions, run from the doc itself so the two cannot differ.
deploy_nodelocaldns() { # image [autopath|kube-dns]
	local image=$1 mode=${2:-} sedline
	sedline=$(awk '/^### iptables mode/{f=1} f&&/^```sh/{g=1;next} g&&/^```/{exit} g' docs/deploy.md)
	[ -n "$sedline" ] || { echo "$log_prefix: no iptables-mode sed block in docs/deploy.md" >&2; exit 1; }
	(cd "$work" && localdns=$localdns kubedns=$kubedns domain=$domain image=$image \
		repo=$repo bash -euc "cd \"\$repo\"; ${sedline//> nodelocaldns.yaml/> \"$work/nodelocaldns.yaml\"}")
	if [ "$mode" = kube-dns ]; then
		# The manifest's own line for it (docs/deploy.md, "Every name to kube-dns").
		grep -q '^ *# - -external-upstream=kube-dns$' "$work/nodelocaldns.yaml" ||
			{ echo "$log_prefix: deploy/daemonset.yaml has no '# - -external-upstream=kube-dns' line" >&2; exit 1; }
		sed -i -e 's/^\( *\)# - -external-upstream=kube-dns$/\1- -external-upstream=kube-dns/' "$work/nodelocaldns.yaml"
	fi
	if [ "$mode" = autopath ]; then
		# The manifest's own instruction: uncomment -autopath. Its pod
		# watch needs the service account token, which the manifest mounts
		# (the kube-dns endpoint watch needs it too): it must be true.
		grep -q '^ *# - -autopath$' "$work/nodelocaldns.yaml" &&
			grep -q '^ *automountServiceAccountToken: true$' "$work/nodelocaldns.yaml" ||
			{ echo "$log_prefix: deploy/daemonset.yaml has no '# - -autopath' line, or does not mount the token (automountServiceAccountToken: true)" >&2; exit 1; }
		sed -i -e 's/^\( *\)# - -autopath$/\1- -autopath/' "$work/nodelocaldns.yaml"
		# Its grant to watch pods, applied with -autopath only.
		k apply -f "$repo/deploy/autopath/rbac.yaml" >/dev/null
	else
		k delete --ignore-not-found -f "$repo/deploy/autopath/rbac.yaml" >/dev/null
	fi
	k apply -f "$work/nodelocaldns.yaml" >/dev/null
	k -n kube-system rollout status ds/nodelocaldns --timeout=180s >/dev/null
}
