#!/usr/bin/env bash
# bench/misscost.sh: what one miss costs a server in kernel and runtime
# terms, counted rather than timed, so the figures hold on a busy machine:
# context switches, syscalls (by kind), futex calls, wake-ups, CPU ns per
# forwarded query, at a fixed moderate rate.
#
# Usage: bench/misscost.sh LABEL=BINARY... [unbound]
#   e.g. bench/misscost.sh base=/tmp/base/nld branch=/tmp/nld unbound
# Each server is measured MC_REPS times on each workload, the servers
# alternating, so a burst of other work hits all of them alike.
#
# As bench/run.sh: the server pinned to core 0 (taskset), dnsperf and the
# test upstream (bench/upstream) to core 1, all on loopback. Per run: the
# server starts, takes MC_WARM unique names (threads, TCP connections
# and worker goroutines exist afterwards), then MC_N further unique names
# at MC_RATE qps (dnsperf -Q, 32 clients) while `perf stat -p` counts
# tracepoints over its threads; the /proc and schedstat figures are
# before/after differences. Everything is divided by the queries dnsperf
# saw completed.
#
# Environment: MC_N [20000], MC_WARM [3000], MC_RATE [10000], MC_REPS [3],
#   MC_WORKLOADS [unique uniqext; also tcphit: one cached name over TCP,
#   for the TCP hit path's counts], MC_OUT [bench/out/misscost],
#   MC_RECORD [unset; set: also `perf record -g` each measured part into
#   $MC_OUT/LABEL.WORKLOAD.REP.data, kernel included].
# Addresses: upstream 127.0.0.92:53 (node resolver) and 127.0.0.93:53
# (kube-dns), servers on 127.0.0.91:5391 (away from bench/run.sh's).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
N=${MC_N:-20000}
WARM=${MC_WARM:-3000}
RATE=${MC_RATE:-10000}
REPS=${MC_REPS:-3}
WORKLOADS=${MC_WORKLOADS:-unique uniqext}
OUT=${MC_OUT:-$BENCH_DIR/out/misscost}
LISTEN=127.0.0.91
PORT=5391
NODE_RESOLVER=127.0.0.92
KUBE_DNS=127.0.0.93
BIN=$OUT/bin
mkdir -p "$OUT" "$BIN"

log() { printf '%s misscost: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

(cd "$BENCH_DIR" && go build -o "$BIN/upstream" ./upstream && go build -o "$BIN/cpuns" ./cpuns)

PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

spawn() { # LOG CORE CMD...; pid in SPAWNED
	local logf=$1 core=$2
	shift 2
	setsid taskset -c "$core" "$@" >"$logf" 2>&1 </dev/null &
	SPAWNED=$!
	PIDS+=("$SPAWNED")
}

stop() { # PID: TERM its group, KILL after 20 s
	local pid=$1 i
	kill -TERM -- "-$pid" 2>/dev/null || true
	for ((i = 0; i < 200; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL -- "-$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

ready() {
	local i
	for ((i = 0; i < 100; i++)); do
		dig +time=1 +tries=1 +short -p "$PORT" "@$LISTEN" ready.bench.example A >/dev/null 2>&1 && return 0
		sleep 0.2
	done
	return 1
}

# In a directory of its own: the daemon watches resolv.conf's directory (inotify), and
# dnsperf -v writes a line per query into $OUT while it runs, which would wake the
# watcher (a read(2) and a goroutine) for every few queries.
mkdir -p "$OUT/etc"
printf 'nameserver %s\n' "$NODE_RESOLVER" >"$OUT/etc/resolv.conf"
spawn "$OUT/upstream.log" 1 "$BIN/upstream" -listen "$NODE_RESOLVER:53,$KUBE_DNS:53"
sleep 0.5

unbound_conf() {
	cat <<EOF
server:
    interface: $LISTEN@$PORT
    port: $PORT
    do-daemonize: no
    num-threads: 1
    use-syslog: no
    logfile: ""
    chroot: ""
    username: ""
    pidfile: ""
    directory: "$OUT"
    verbosity: 0
    access-control: 127.0.0.0/8 allow
    module-config: "iterator"
    do-not-query-localhost: no
    unblock-lan-zones: yes
    insecure-lan-zones: yes
    incoming-num-tcp: 64
    outgoing-num-tcp: 16
forward-zone:
    name: "cluster.local."
    forward-addr: $KUBE_DNS@53
    forward-tcp-upstream: yes
forward-zone:
    name: "."
    forward-addr: $NODE_RESOLVER@53
EOF
}

start() { # LABEL BINARY
	if [[ $1 == unbound ]]; then
		unbound_conf >"$OUT/unbound.conf"
		spawn "$OUT/$1.log" 0 unbound -d -c "$OUT/unbound.conf"
	else
		spawn "$OUT/$1.log" 0 "$2" -localip "$LISTEN" -port "$PORT" -kube-dns "$KUBE_DNS:53" \
			-resolv-conf "$OUT/etc/resolv.conf" -setupinterface=false -setupiptables=false \
			-metrics-listen-address "$LISTEN:19391" -health-port 18391 -cluster-domain cluster.local
	fi
	SPID=$SPAWNED
	ready || {
		log "$1 did not start"
		tail "$OUT/$1.log" >&2
		exit 1
	}
}

names() { # WORKLOAD PREFIX COUNT
	case $1 in
	unique) awk -v n="$3" -v p="$2" 'BEGIN { for (i = 0; i < n; i++) printf "%s%d.default.svc.cluster.local A\n", p, i }' ;;
	uniqext) awk -v n="$3" -v p="$2" 'BEGIN { for (i = 0; i < n; i++) printf "%s%d.site-%d.example.com A\n", p, i, i % 997 }' ;;
	tcphit) awk -v n="$3" 'BEGIN { for (i = 0; i < n; i++) print "svc-1.default.svc.cluster.local A" }' ;;
	esac
}

# ctxsw PID: voluntary and nonvoluntary switches summed over the live threads.
ctxsw() {
	cat /proc/"$1"/task/*/status 2>/dev/null | awk '$1 == "voluntary_ctxt_switches:" { v += $2 } $1 == "nonvoluntary_ctxt_switches:" { n += $2 } END { print v + 0, n + 0 }'
}

EVENTS=raw_syscalls:sys_enter,sched:sched_switch,sched:sched_wakeup,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_recvmmsg,syscalls:sys_enter_sendmmsg,syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_recvfrom,syscalls:sys_enter_sendto,syscalls:sys_enter_nanosleep,syscalls:sys_enter_sched_yield,syscalls:sys_enter_tgkill,syscalls:sys_enter_getpid,syscalls:sys_enter_clock_gettime
printf 'label\tworkload\trep\tdone\tcpu_us\tvol\tinvol\tsyscalls\tswitches\twakeups\tfutex\tepoll\trecvmmsg\tsendmmsg\tread\twrite\trecvfrom\tsendto\tnanosleep\tsched_yield\ttgkill\tp50_ms\tp99_ms\tthreads\n' >"$OUT/results.tsv"

measure() { # LABEL BINARY WORKLOAD REP
	local label=$1 bin=$2 w=$3 rep=$4 tag
	tag=$label.$w.$rep
	start "$label" "$bin"
	names "$w" "w$rep$RANDOM" "$WARM" >"$OUT/warm.txt"
	names "$w" "m$rep$RANDOM" "$N" >"$OUT/q.txt"
	local mode=udp
	[[ $w == tcphit ]] && mode=tcp
	taskset -c 1 dnsperf -s "$LISTEN" -p "$PORT" -m "$mode" -d "$OUT/warm.txt" -n 1 -c 32 -q 100 -Q "$RATE" >"$OUT/$tag.warm.txt" 2>&1 || true
	sleep 0.5
	local c0 c1 s0 s1 pp
	read -r c0 < <("$BIN/cpuns" "$SPID" | awk '{ print $2 }')
	s0=$(ctxsw "$SPID")
	perf stat -x '	' -e "$EVENTS" -p "$SPID" -o "$OUT/$tag.perf" &
	pp=$!
	local pr=""
	if [[ -n ${MC_RECORD:-} ]]; then # a call-graph profile of the measured part, kernel included
		perf record -q -g -F 4999 -p "$SPID" -o "$OUT/$tag.data" >/dev/null 2>&1 &
		pr=$!
	fi
	sleep 0.3
	taskset -c 1 dnsperf -s "$LISTEN" -p "$PORT" -m "$mode" -d "$OUT/q.txt" -n 1 -c 32 -q 100 -Q "$RATE" -v >"$OUT/$tag.txt" 2>&1 || true
	sleep 0.3
	kill -INT "$pp"
	wait "$pp" || true
	if [[ -n $pr ]]; then
		kill -INT "$pr"
		wait "$pr" || true
	fi
	read -r c1 < <("$BIN/cpuns" "$SPID" | awk '{ print $2 }')
	s1=$(ctxsw "$SPID")
	local threads
	threads=$(ls /proc/"$SPID"/task | wc -l)
	stop "$SPID"
	local done lat
	done=$(awk '/Queries completed/ { print $3; exit }' "$OUT/$tag.txt")
	lat=$(awk '/^> / { print $NF }' "$OUT/$tag.txt" | sort -g | awk '{ v[NR] = $1 } END { printf "%.3f %.3f", v[int(NR * 0.5)] * 1000, v[int(NR * 0.99)] * 1000 }')
	grep -v '^> ' "$OUT/$tag.txt" >"$OUT/$tag.summary" || true
	[[ -n ${MC_KEEP:-} ]] || rm -f "$OUT/$tag.txt"
	awk -v label="$label" -v w="$w" -v rep="$rep" -v done="$done" -v cpu=$((c1 - c0)) -v s0="$s0" -v s1="$s1" -v lat="$lat" -v threads="$threads" -F '\t' '
		{ c[$3] = $1 }
		END {
			split(s0, a, " "); split(s1, b, " "); split(lat, l, " ")
			d = done > 0 ? done : 1
			printf "%s\t%s\t%s\t%d\t%.1f\t%.2f\t%.2f", label, w, rep, done, cpu / 1e3 / d, (b[1] - a[1]) / d, (b[2] - a[2]) / d
			n = split("raw_syscalls:sys_enter sched:sched_switch sched:sched_wakeup syscalls:sys_enter_futex EPOLL syscalls:sys_enter_recvmmsg syscalls:sys_enter_sendmmsg syscalls:sys_enter_read syscalls:sys_enter_write syscalls:sys_enter_recvfrom syscalls:sys_enter_sendto syscalls:sys_enter_nanosleep syscalls:sys_enter_sched_yield syscalls:sys_enter_tgkill", k, " ")
			for (i = 1; i <= n; i++) {
				v = k[i] == "EPOLL" ? c["syscalls:sys_enter_epoll_pwait"] + c["syscalls:sys_enter_epoll_wait"] : c[k[i]]
				printf "\t%.2f", v / d
			}
			printf "\t%s\t%s\t%s\n", l[1], l[2], threads
		}' "$OUT/$tag.perf" | tee -a "$OUT/results.tsv"
}

SERVERS=()
for a in "$@"; do SERVERS+=("$a"); done
for w in $WORKLOADS; do
	for ((rep = 1; rep <= REPS; rep++)); do
		for s in "${SERVERS[@]}"; do
			if [[ $s == unbound ]]; then
				measure unbound "" "$w" "$rep"
			else
				measure "${s%%=*}" "${s#*=}" "$w" "$rep"
			fi
		done
	done
done
log "results in $OUT/results.tsv"
column -t -s '	' "$OUT/results.tsv" >&2
