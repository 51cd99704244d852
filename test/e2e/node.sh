#!/usr/bin/env bash
# The e2e node: run by run.sh inside the node's network namespace and a
# mount namespace of its own (unshare --mount --propagation slave), it
# starts etcd, the control plane, containerd, the kubelet and kube-proxy as
# its children and waits. Everything it mounts (a tmpfs on /run, the node's
# resolv.conf over /etc/resolv.conf, containerd's and the kubelet's mounts)
# lives and dies with this mount namespace; its addresses, routes and
# iptables rules with the network namespace. On SIGTERM it stops the
# children, kubelet first, and returns.
#
#   node.sh WORKDIR BINDIR    (WORKDIR written by run.sh: certs, configs)
set -euo pipefail
work=$1 bin=$2
logs=$work/logs
mkdir -p "$logs"

# Private /run: containerd's state and socket, the pods' network namespace
# files, /run/nodelocaldns (the DaemonSet's hostPath) and /run/xtables.lock
# are this node's, not the host's.
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/lock
# The node's resolvers: the stand-in upstream (run.sh). The kubelet gives
# this file to dnsPolicy Default pods, nodelocaldns among them.
mount --bind "$work/resolv.conf" /etc/resolv.conf

sysctl -qw net.ipv4.ip_forward=1
# Pods on the bridge reaching a Service whose endpoint is on the same bridge.
sysctl -qw net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1

pids=()
start() { # name command...
	local name=$1; shift
	"$@" >"$logs/$name.log" 2>&1 &
	pids+=($!)
	echo "$name $!" >>"$work/pids"
}
stop() {
	# The kubelet first, so it does not restart what containerd stops;
	# each gets 5 s to exit, then SIGKILL (run.sh kills what is left).
	local i n
	trap - TERM INT EXIT
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill "${pids[i]}" 2>/dev/null || continue
		for ((n = 0; n < 50; n++)); do kill -0 "${pids[i]}" 2>/dev/null || break; sleep 0.1; done
		kill -9 "${pids[i]}" 2>/dev/null || true
	done
	wait 2>/dev/null || true
	exit 0
}
trap stop TERM INT EXIT

waitfor() { # what seconds command...
	local what=$1 secs=$2 deadline; shift 2
	deadline=$(($(date +%s) + secs))
	until "$@" >/dev/null 2>&1; do
		if (($(date +%s) > deadline)); then echo "node: $what not up after ${secs}s" >&2; return 1; fi
		sleep 0.3
	done
}

start etcd etcd --data-dir "$work/etcd" --listen-client-urls http://127.0.0.1:2379 \
	--advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
	--initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster default=http://127.0.0.1:2380
waitfor etcd 60 curl -sf http://127.0.0.1:2379/health

pki=$work/pki
start kube-apiserver "$bin/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
	--bind-address=0.0.0.0 --secure-port=6443 --advertise-address="$NODE_IP" \
	--tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
	--client-ca-file="$pki/ca.crt" --token-auth-file="$work/tokens.csv" \
	--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
	--service-account-issuer=https://kubernetes.default.svc.cluster.local \
	--service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
	--service-cluster-ip-range="$SERVICE_CIDR" --allow-privileged=true \
	--kubelet-preferred-address-types=InternalIP
waitfor kube-apiserver 120 curl -sfk -H "Authorization: Bearer $ADMIN_TOKEN" https://127.0.0.1:6443/readyz

start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig="$work/kcm.kubeconfig" \
	--bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
	--service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
	--service-cluster-ip-range="$SERVICE_CIDR" --cluster-cidr="$POD_CIDR" --allocate-node-cidrs=false \
	--authentication-kubeconfig="$work/kcm.kubeconfig" --authorization-kubeconfig="$work/kcm.kubeconfig"
start kube-scheduler "$bin/kube-scheduler" --kubeconfig="$work/sched.kubeconfig" \
	--bind-address=127.0.0.1 --leader-elect=false \
	--authentication-kubeconfig="$work/sched.kubeconfig" --authorization-kubeconfig="$work/sched.kubeconfig"

start containerd containerd --config "$work/containerd.toml"
waitfor containerd 60 ctr --address /run/containerd/containerd.sock version
for img in "$work"/images/*.tar; do
	ctr --address /run/containerd/containerd.sock -n k8s.io images import "$img" >>"$logs/images.log"
done

# The kubelet's graceful node shutdown (shutdownGracePeriod in its
# configuration) asks logind over the system bus; this node runs no
# systemd: a bus of its own on the private /run (the path the kubelet's
# client uses by default) and logind's part played by test/e2e/logind,
# which TestNodeShutdownLookupsSucceed signals. make conformance builds no
# logind: its kubelet logs that the shutdown manager did not start.
if [ -x "$work/logind" ]; then
	mkdir -p /run/dbus
	cat >"$work/dbus.conf" <<EOC
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=/run/dbus/system_bus_socket</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="root"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
EOC
	start dbus dbus-daemon --nofork --nopidfile --config-file="$work/dbus.conf"
	waitfor dbus 30 test -S /run/dbus/system_bus_socket
	start logind "$work/logind" -pidfile "$work/logind.pid"
	waitfor logind 30 test -s "$work/logind.pid"
fi

start kubelet "$bin/kubelet" --config="$work/kubelet.yaml" --kubeconfig="$work/kubelet.kubeconfig" \
	--root-dir="$work/kubelet" --cert-dir="$work/kubelet/pki" --node-ip="$NODE_IP" \
	--hostname-override="$NODE_NAME"
start kube-proxy "$bin/kube-proxy" --config="$work/kube-proxy.yaml"

echo "node: all started" >&2
touch "$work/node-started"
wait -n || true
echo "node: a component exited; see $logs" >&2
exit 1
