#!/bin/bash
# bench/bigconfig.sh: what a large configuration costs (issue 41 item 7).
#
#   bench/bigconfig.sh [label=path/to/nodelocaldns ...]
#
# Without arguments it builds ./cmd/nodelocaldns. For each binary it prints:
#   - `-check-config` of a Corefile with 5,000 forward blocks (wall and CPU seconds);
#   - `-check-config` with a kube-dns ConfigMap of 20,000 stub domains;
#   - the daemon started with those 20,000 stub domains: seconds to /ready and CPU seconds spent;
#   - the CPU seconds one edit of that ConfigMap costs (measured over 15 s after the edit).
# Targets: each start and check ≤ 1 s, an edit ≤ 0.5 CPU-s. No root needed; traffic stays on
# 127.0.0.0/8 (a random address, port 5399; metrics on 9399); nothing is sent upstream.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ $# -eq 0 ]; then
	go build -o "$work/nodelocaldns" ./cmd/nodelocaldns
	set -- "this=$work/nodelocaldns"
fi

python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
head = "cluster.local:53 {\n    errors\n    cache 30\n    forward . 10.96.0.10 {\n        force_tcp\n    }\n}\n"
tail = ".:53 {\n    errors\n    cache 30\n    forward . /etc/resolv.conf\n}\n"
with open(w + "/blocks.Corefile", "w") as f:
    f.write(head)
    for i in range(5000):
        f.write("z%d.example.com:53 {\n    errors\n    cache 30\n    forward . 10.0.%d.%d\n}\n" % (i, i // 250, i % 250 + 1))
    f.write(tail)
with open(w + "/small.Corefile", "w") as f:
    f.write(head + tail)
d = {"z%d.example.com" % i: ["10.%d.%d.%d" % (1 + i // 62500, (i // 250) % 250, i % 250 + 1)] for i in range(20000)}
import os
os.makedirs(w + "/cm")
json.dump(d, open(w + "/cm/stubDomains", "w"))
PY

tick=$(getconf CLK_TCK)
cpu_of() { awk -v t="$tick" '{printf "%.2f", ($14+$15)/t}' "/proc/$1/stat"; }
timed() { /usr/bin/time -f "%e s wall, %U+%S s CPU" "$@" >/dev/null 2>"$work/time" || true; tail -1 "$work/time"; }

# start BIN COREFILE [CMDIR]: starts the daemon, waits for /ready; sets pid, prints seconds and CPU.
start() {
	local bin=$1 conf=$2 cm=${3:-}
	ip=127.0.$((RANDOM % 200 + 20)).$((RANDOM % 200 + 20))
	rm -rf "$work/run" && mkdir "$work/run"
	local cmflag=(-kubednscm "")
	if [ -n "$cm" ]; then cp -r "$cm" "$work/run/cm"; cmflag=(-kubednscm "$work/run/cm"); fi
	local t0 t1
	t0=$(date +%s.%N)
	"$bin" -conf "$conf" "${cmflag[@]}" -localip "$ip" -port 5399 \
		-kube-dns 127.0.0.1:1 -setupinterface=false -setupiptables=false -state-dir "$work/run/state" \
		-health-port 0 -metrics-listen-address "$ip:9399" >"$work/run/log" 2>&1 &
	pid=$!
	for _ in $(seq 1 1200); do
		curl -sf "http://$ip:9399/ready" >/dev/null 2>&1 && break
		if ! kill -0 "$pid" 2>/dev/null; then echo "daemon exited:"; tail -3 "$work/run/log"; return 1; fi
		sleep 0.05
	done
	t1=$(date +%s.%N)
	printf '%.2f s to /ready, %s s CPU\n' "$(echo "$t1 - $t0" | bc)" "$(cpu_of "$pid")"
}

for arg in "$@"; do
	label=${arg%%=*} bin=${arg#*=}
	echo "== $label ($bin)"
	echo "check-config, 5,000 blocks:          $(timed "$bin" -check-config -conf "$work/blocks.Corefile" -localip 127.0.0.1)"
	echo "check-config, 20,000 stub domains:   $(timed "$bin" -check-config -conf "$work/small.Corefile" -kubednscm "$work/cm" -localip 127.0.0.1)"
	printf 'start, 5,000 blocks:                 '
	start "$bin" "$work/blocks.Corefile" || continue
	kill "$pid"; wait "$pid" 2>/dev/null || true
	printf 'start, 20,000 stub domains:          '
	start "$bin" "$work/small.Corefile" "$work/cm" || continue
	c0=$(cpu_of "$pid")
	sleep 3
	c1=$(cpu_of "$pid")
	python3 -c "
import json; p='$work/run/cm/stubDomains'; d=json.load(open(p)); d['z0.example.com']=['10.9.9.9']
json.dump(d, open(p + '.new', 'w'))"
	mv "$work/run/cm/stubDomains.new" "$work/run/cm/stubDomains"
	sleep 15
	c2=$(cpu_of "$pid")
	printf 'one ConfigMap edit:                  %.2f s CPU (idle 3 s before it: %.2f s)\n' "$(echo "$c2 - $c1" | bc)" "$(echo "$c1 - $c0" | bc)"
	kill "$pid"; wait "$pid" 2>/dev/null || true
done
