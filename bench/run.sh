#!/usr/bin/env bash
# bench/run.sh: dnsperf side by side, nodelocaldns against the real stock
# node-local-dns (k8s-dns-node-cache, unpacked from ../shared/oracles at bench
# time), CoreDNS (stock node-local-dns Corefile), Unbound and dnsmasq, each a
# node-local cache in front of the same test upstream (bench/upstream).
#
# Usage: bench/run.sh          (or: make bench)
#        bench/run.sh profile  (or: make profile): CPU profiles of nodelocaldns
#            under dnsperf load, one per workload of PROFILE_WORKLOADS, in
#            bench/cpu-miss-tcp.pprof (unique) and bench/cpu-miss-udp.pprof
#            (uniqext), each with its `go tool pprof -top` in *.top.txt
#        BENCH_QUICK=1 bench/run.sh: a smoke run (see below)
#
# Every server runs pinned to core 0, dnsperf and the test upstream to core 1.
# Everything runs on loopback: servers on 127.0.0.1, the upstream on
# 127.0.0.2:53 (node resolvers) and 127.0.0.3:53 (kube-dns). Every process
# started here is stopped on exit.
#
# Environment (defaults in brackets):
#   BENCH_DURATION       seconds per unlimited-rate run [10]
#   BENCH_CPU_DURATION   seconds per fixed-rate run (CPU/query, latency) [5]
#   BENCH_CPU_REPS       fixed-rate runs per server and workload, interleaved
#                        across servers; results.tsv holds their medians,
#                        reps.tsv every one [3; 1 with BENCH_QUICK=1]
#   BENCH_CPU_RATE       offered qps of the fixed-rate runs on hit workloads [20000]
#   BENCH_MISS_CPU_RATE  offered qps of the fixed-rate run on unique misses [10000]
#   BENCH_CLIENTS        dnsperf -c [32]
#   BENCH_OUTSTANDING    dnsperf -q [100]
#   BENCH_SERVERS        [nodelocaldns node-local-dns coredns unbound dnsmasq ceiling limit]
#   BENCH_ORACLES        directory of the stock node-local-dns binary, node-cache.xz
#                        and node-cache.sha256 [../shared/oracles beside the repository];
#                        without it the node-local-dns row says n/a
#   BENCH_WORKLOADS      [hit1 hit20 nx1 names10k unique uniqext tcphit]
#   BENCH_QUICK=1        smoke run: 2 s runs, one fixed-rate run each, workloads
#                        "hit1 unique uniqext tcphit", no memory phase, RESULTS.md and results.png
#                        written to bench/out/ (never commit a smoke run)
#   BENCH_NODELOCALDNS_ARGS  extra flags for the daemon (and the previous build)
#   BENCH_PREVIOUS=REV   adds a "previous" row: nodelocaldns built from git
#                        revision REV (e.g. main, or the commit before a change),
#                        run with the same flags in the same run, interleaved
#                        with the others; the report's ratio columns then show
#                        this build against it ("CPU ÷ previous"). Built from
#                        `git archive REV` in a temporary directory, cached by
#                        commit in bench/.cache/bin/nodelocaldns-<commit>.
#   BENCH_SKIP_INSTALL=1 never call apt-get
#   COREDNS_VERSION      [v1.15.0]
#   BENCH_NODE_RESOLVER, BENCH_KUBE_DNS  upstream addresses, port 53 [127.0.0.2, 127.0.0.3]
#   PROFILE_WORKLOADS    workloads of `profile` [unique uniqext]
#   PROFILE_SECONDS      length of each profile [15]
#   BENCH_AUTOPATH=1     also the autopath workload (issue 15): a pod-like client
#                        (bench/podclient: Go's resolver, ndots:5, the kubelet's
#                        search list) resolving external names without and with
#                        -autopath; queries received and daemon CPU per lookup,
#                        appended to RESULTS.md. Needs root, etcd and the cached
#                        kube-apiserver (test/apiserver). `bench/run.sh autopath`
#                        runs only it (output in bench/out/autopath.md).
#   BENCH_AUTOPATH_DURATION, BENCH_AUTOPATH_RATE  [BENCH_CPU_DURATION, 500 lookups/s]
# Writes bench/RESULTS.md, bench/results.png; raw output in bench/out/
# (results.tsv: one row per server and workload; reps.tsv: every fixed-rate run).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$BENCH_DIR")
CACHE=$BENCH_DIR/.cache
BIN=$CACHE/bin
OUT=$BENCH_DIR/out

QUICK=${BENCH_QUICK:-0}
if [[ $QUICK == 1 ]]; then
	DURATION=${BENCH_DURATION:-2}
	CPU_DURATION=${BENCH_CPU_DURATION:-2}
	CPU_REPS=${BENCH_CPU_REPS:-1}
	BENCH_WORKLOADS=${BENCH_WORKLOADS:-hit1 unique uniqext tcphit}
else
	DURATION=${BENCH_DURATION:-10}
	CPU_DURATION=${BENCH_CPU_DURATION:-5}
fi
# Three fixed-rate runs per server and workload: on this shared 2-core machine
# one run's p99 scatters by 2x and its CPU/query by 10-20% (stalls hit
# whichever server runs then, some runs more than others); the median of three
# outvotes one disturbed run, and three keeps `make bench` within half an hour.
((QUICK)) || CPU_REPS=${BENCH_CPU_REPS:-3}
# A fixed-rate run other work took more than MAX_NOISE % of a core from
# (server's or client's) is run once more at the end of its workload, up to
# EXTRA_REPS extra runs per server (none in a smoke run); the report's
# maxNoise is the same 10.
MAX_NOISE=10
EXTRA_REPS=$CPU_REPS
((QUICK)) && EXTRA_REPS=0
CPU_RATE=${BENCH_CPU_RATE:-20000}
MISS_CPU_RATE=${BENCH_MISS_CPU_RATE:-10000}
CLIENTS=${BENCH_CLIENTS:-32}
OUTSTANDING=${BENCH_OUTSTANDING:-100}
SERVERS=${BENCH_SERVERS:-nodelocaldns node-local-dns coredns unbound dnsmasq ceiling limit}
WORKLOADS=${BENCH_WORKLOADS:-hit1 hit20 nx1 names10k unique uniqext tcphit}
COREDNS_VERSION=${COREDNS_VERSION:-v1.15.0}
# Unique names generated per second of run: above any server's miss rate here.
UNIQUE_PER_SECOND=${BENCH_UNIQUE_PER_SECOND:-100000}

SERVER_CORE=0
CLIENT_CORE=1
NODE_RESOLVER=${BENCH_NODE_RESOLVER:-127.0.0.2}
KUBE_DNS=${BENCH_KUBE_DNS:-127.0.0.3}
LISTEN=127.0.0.1
declare -A PORT=([nodelocaldns]=5301 [coredns]=5302 [unbound]=5303 [dnsmasq]=5304 [ceiling]=5305 [limit]=5306 [node-local-dns]=5307 [previous]=5308)
# Second port of each server: metrics (and pprof) / health.
declare -A MPORT=([nodelocaldns]=19301 [coredns]=19302 [node-local-dns]=19307 [previous]=19308)
declare -A HPORT=([nodelocaldns]=18301 [coredns]=18302 [node-local-dns]=18307 [previous]=18308)
# node-cache's own metrics endpoint (-metrics-listen-address, default 0.0.0.0:9353).
STOCK_MPORT=19317
ORACLES=${BENCH_ORACLES:-$(dirname "$ROOT")/shared/oracles}
STOCK_STATUS="n/a: not unpacked in this mode"
PREVIOUS=${BENCH_PREVIOUS:-}
PREV_STATUS="n/a: BENCH_PREVIOUS not set"
PREV_COMMIT=
# The previous build runs right after this one, in every phase.
if [[ -n $PREVIOUS && " $SERVERS " != *" previous "* ]]; then
	SERVERS=$(awk -v s="$SERVERS" 'BEGIN { n = split(s, a, " "); for (i = 1; i <= n; i++) { o = o (o ? " " : "") a[i]; if (a[i] == "nodelocaldns") { o = o " previous"; p = 1 } }
		if (!p) o = o " previous"; print o }')
fi

export PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/go/bin
COMMAND="${PREVIOUS:+BENCH_PREVIOUS=$PREVIOUS }BENCH_QUICK=$QUICK BENCH_DURATION=$DURATION BENCH_CPU_DURATION=$CPU_DURATION BENCH_CPU_REPS=$CPU_REPS BENCH_CPU_RATE=$CPU_RATE BENCH_MISS_CPU_RATE=$MISS_CPU_RATE BENCH_CLIENTS=$CLIENTS BENCH_OUTSTANDING=$OUTSTANDING bench/run.sh ${1:-bench}"

log() { printf '%s bench: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

[[ $CPU_REPS =~ ^[1-9][0-9]*$ ]] || die "BENCH_CPU_REPS=$CPU_REPS: want a whole number of runs, 1 or more"

# ---------------------------------------------------------------- processes

PIDS=() # process groups started here (each via setsid, so pid == pgid)

# signal SIG PID: SIG to PID's process group (to PID alone if setsid has not
# made the group yet).
signal() {
	kill -"$1" -- "-$2" 2>/dev/null || kill -"$1" "$2" 2>/dev/null || true
}

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	local pid
	for pid in "${PIDS[@]}"; do
		signal TERM "$pid"
	done
	for pid in "${PIDS[@]}"; do
		wait_gone "$pid" 5 || signal KILL "$pid"
	done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_gone PID SECONDS: true once PID has exited (and been reaped).
wait_gone() {
	local pid=$1 deadline=$((SECONDS + $2))
	while kill -0 "$pid" 2>/dev/null; do
		if ((SECONDS >= deadline)); then
			return 1
		fi
		sleep 0.1
	done
	wait "$pid" 2>/dev/null || true
}

# spawn LOG CORE CMD...: starts CMD pinned to CORE in its own process group;
# its pid is left in SPAWNED.
spawn() {
	local logf=$1 core=$2
	shift 2
	setsid taskset -c "$core" "$@" >"$logf" 2>&1 </dev/null &
	SPAWNED=$!
	disown "$SPAWNED" # the shell's job notices ("Killed") would clutter the log
	PIDS+=("$SPAWNED")
}

# stop PID [NAME]: TERM its process group, KILL after 20 s (nodelocaldns
# keeps answering for its lame-duck time, 5 s, before it drains).
stop() {
	local pid=$1 name=${2:-} p keep=() t0=$SECONDS
	signal TERM "$pid"
	if wait_gone "$pid" 20; then
		if [[ -n $name ]]; then log "$name: exited $((SECONDS - t0)) s after SIGTERM"; fi
	else
		log "${name:-pid $pid}: still running 20 s after SIGTERM; killed"
		signal KILL "$pid"
		wait_gone "$pid" 2 || true
	fi
	for p in "${PIDS[@]}"; do
		[[ $p == "$pid" ]] || keep+=("$p")
	done
	PIDS=("${keep[@]}")
}

# ready HOST PORT PID: waits (20 s at most) until HOST:PORT answers a query.
ready() {
	local host=$1 port=$2 pid=$3 deadline=$((SECONDS + 20))
	while ((SECONDS < deadline)); do
		kill -0 "$pid" 2>/dev/null || return 1
		if dig +time=1 +tries=1 +short -p "$port" "@$host" ready.bench.example A >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.2
	done
	return 1
}

# --------------------------------------------------------------- install/build

need_packages() {
	local missing=() cmd pkg
	for cmd in "$@"; do
		pkg=${cmd#*:}
		command -v "${cmd%%:*}" >/dev/null 2>&1 || missing+=("$pkg")
	done
	((${#missing[@]} == 0)) && return 0
	[[ ${BENCH_SKIP_INSTALL:-} == 1 ]] && die "missing packages: ${missing[*]} (BENCH_SKIP_INSTALL=1)"
	((EUID == 0)) || die "missing packages: ${missing[*]}; run as root or install them"
	log "installing ${missing[*]} from apt"
	# Keep apt from starting unbound/dnsmasq as system services.
	local policy=/usr/sbin/policy-rc.d added=
	if [[ ! -e $policy ]]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && added=1
	fi
	local ok=1
	if ! DEBIAN_FRONTEND=noninteractive apt-get update -qq ||
		! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
		ok=0
	fi
	if [[ -n $added ]]; then rm -f "$policy"; fi
	((ok)) || die "apt-get install ${missing[*]} failed"
}

build_tools() {
	mkdir -p "$BIN"
	log "building bench tools (upstream, report, chart, cpuns, limit)"
	(cd "$BENCH_DIR" && go build -o "$BIN/" ./upstream ./report ./chart ./cpuns)
	# -O2, as Debian builds Unbound and dnsmasq.
	gcc -O2 -Wall -Wextra -Werror -pthread -o "$BIN/limit" "$BENCH_DIR/limit/limit.c"
}

build_coredns() {
	# The tests' oracle is the same build (test/coredns/build.sh, same
	# flags), cached outside the work tree: share it when it is there.
	local shared=${NLD_CACHE:-/var/cache/nodelocaldns-test}/coredns-$COREDNS_VERSION
	if [[ ! -x $BIN/coredns-$COREDNS_VERSION && -x $shared ]]; then
		cp "$shared" "$BIN/coredns-$COREDNS_VERSION"
	fi
	if [[ ! -x $BIN/coredns-$COREDNS_VERSION ]]; then
		log "building CoreDNS $COREDNS_VERSION with go install (a few minutes, once)"
		local gobin
		gobin=$(mktemp -d "$CACHE/gobin.XXXXXX")
		# As CoreDNS's own release builds: static, stripped.
		CGO_ENABLED=0 GOBIN=$gobin go install -trimpath -ldflags='-s -w' "github.com/coredns/coredns@$COREDNS_VERSION"
		mv "$gobin/coredns" "$BIN/coredns-$COREDNS_VERSION"
		rmdir "$gobin"
	fi
}

# build_stock: the real stock node-local-dns, unpacked from ORACLES into BIN
# and checked against its sha256 (never copied into the repository); sets
# STOCK_STATUS to ok or to why the row is n/a.
build_stock() {
	STOCK_STATUS="n/a: no stock binary ($ORACLES/node-cache.xz; see its README, or set BENCH_ORACLES)"
	[[ -f $ORACLES/node-cache.xz && -f $ORACLES/node-cache.sha256 ]] || return 0
	need_packages xz:xz-utils sha256sum:coreutils
	local want got
	want=$(awk '{ print $1; exit }' "$ORACLES/node-cache.sha256")
	xz -dc "$ORACLES/node-cache.xz" >"$BIN/node-cache.tmp" || die "xz -dc $ORACLES/node-cache.xz failed"
	got=$(sha256sum "$BIN/node-cache.tmp" | awk '{ print $1 }')
	if [[ $got != "$want" ]]; then
		rm -f "$BIN/node-cache.tmp"
		STOCK_STATUS="n/a: $ORACLES/node-cache.xz unpacks to sha256 $got, node-cache.sha256 says $want"
		return 0
	fi
	chmod +x "$BIN/node-cache.tmp" && mv "$BIN/node-cache.tmp" "$BIN/node-cache"
	STOCK_STATUS=ok
}

# build_nodelocaldns: sets NLD_STATUS to "ok" or to why it is n/a.
build_nodelocaldns() {
	NLD_STATUS=ok
	if [[ ! -d $ROOT/cmd/nodelocaldns ]] || ! compgen -G "$ROOT/cmd/nodelocaldns/*.go" >/dev/null; then
		NLD_STATUS="n/a: cmd/nodelocaldns does not exist yet"
		return 0
	fi
	log "building nodelocaldns"
	if ! (cd "$ROOT" && go build -o "$BIN/nodelocaldns" ./cmd/nodelocaldns) >"$OUT/nodelocaldns-build.log" 2>&1; then
		NLD_STATUS="n/a: go build ./cmd/nodelocaldns failed: $(grep -m1 -v '^#' "$OUT/nodelocaldns-build.log" | cut -c1-160)"
		rm -f "$BIN/nodelocaldns"
	fi
}

# build_previous: nodelocaldns at git revision PREVIOUS, built once per
# commit from `git archive` in a temporary directory (the work tree and its
# git metadata are not touched) and cached in BIN; sets PREV_STATUS to ok or
# to why the row is n/a, PREV_COMMIT to the commit.
build_previous() {
	[[ -n $PREVIOUS ]] || return 0
	if ! PREV_COMMIT=$(git -C "$ROOT" rev-parse --verify --quiet "$PREVIOUS^{commit}"); then
		PREV_STATUS="n/a: BENCH_PREVIOUS=$PREVIOUS is no commit of this repository"
		return 0
	fi
	PREV_STATUS=ok
	[[ -x $BIN/nodelocaldns-$PREV_COMMIT ]] && return 0
	log "building the previous nodelocaldns ($PREVIOUS, ${PREV_COMMIT:0:12})"
	local tmp
	tmp=$(mktemp -d "$CACHE/previous.XXXXXX")
	if ! (git -C "$ROOT" archive "$PREV_COMMIT" | tar -x -C "$tmp" &&
		cd "$tmp" && go build -o "$BIN/nodelocaldns-$PREV_COMMIT.tmp" ./cmd/nodelocaldns) >"$OUT/previous-build.log" 2>&1; then
		PREV_STATUS="n/a: building $PREVIOUS failed: $(grep -m1 -v '^#' "$OUT/previous-build.log" | cut -c1-160)"
		rm -f "$BIN/nodelocaldns-$PREV_COMMIT.tmp"
	else
		mv "$BIN/nodelocaldns-$PREV_COMMIT.tmp" "$BIN/nodelocaldns-$PREV_COMMIT"
	fi
	rm -rf "$tmp"
}

# ------------------------------------------------------------------ queries

gen_queries() {
	local q=$OUT/queries
	mkdir -p "$q"
	echo "kubernetes.default.svc.cluster.local A" >"$q/hit1.txt"
	echo "nxdomain.default.svc.cluster.local A" >"$q/nx1.txt"
	{
		for i in $(seq 0 9); do
			echo "svc-$i.default.svc.cluster.local A"
			echo "www.site-$i.example.com A"
		done
	} >"$q/hit20.txt"
	# 10k distinct names, half in the cluster domain (TTL 30 s), half outside
	# (TTL 300 s): each half fits one 9984-entry CoreDNS cache.
	awk 'BEGIN { for (i = 0; i < 5000; i++) {
		printf "svc-%d.ns-%d.svc.cluster.local A\n", i, i % 50
		printf "host-%d.site-%d.example.com A\n", i, i % 97 } }' >"$q/names10k.txt"
	# Unique names, never repeated: all misses, forwarded to kube-dns over
	# TCP (unique) or to the node's resolvers over UDP (uniqext). Each has a
	# second set, for measuring once more when other work disturbed the
	# first, and one set per fixed-rate run (cR-N: rep R), each a second
	# longer than the run at its rate, so dnsperf's time limit ends it.
	local n=$((UNIQUE_PER_SECOND * DURATION)) m=$((MISS_CPU_RATE * CPU_DURATION + MISS_CPU_RATE)) rep
	awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) printf "u%d.default.svc.cluster.local A\n", i }' >"$q/unique.txt"
	awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) printf "v%d.default.svc.cluster.local A\n", i }' >"$q/unique-retry.txt"
	# External names: 997 sites (a prime, so names spread over many
	# "domains" as real traffic does; every server's cache still misses).
	awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) printf "u%d.site-%d.example.com A\n", i, i % 997 }' >"$q/uniqext.txt"
	awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) printf "v%d.site-%d.example.com A\n", i, i % 997 }' >"$q/uniqext-retry.txt"
	for rep in $(seq 1 $((CPU_REPS + EXTRA_REPS))); do
		awk -v n="$m" -v r="$rep" 'BEGIN { for (i = 0; i < n; i++) printf "c%d-%d.default.svc.cluster.local A\n", r, i }' >"$q/unique-cpu-$rep.txt"
		awk -v n="$m" -v r="$rep" 'BEGIN { for (i = 0; i < n; i++) printf "c%d-%d.site-%d.example.com A\n", r, i, i % 997 }' >"$q/uniqext-cpu-$rep.txt"
	done
	# Names for the memory phase: 10k, then 90k more (100k distinct in all).
	awk 'BEGIN { for (i = 0; i < 10000; i++) if (i % 2) printf "r%d.default.svc.cluster.local A\n", i; else printf "r%d.example.net A\n", i }' >"$q/rss10k.txt"
	awk 'BEGIN { for (i = 10000; i < 100000; i++) if (i % 2) printf "r%d.default.svc.cluster.local A\n", i; else printf "r%d.example.net A\n", i }' >"$q/rss100k.txt"
}

# workload NAME [REP]: sets W_FILE, W_RETRY_FILE, W_MODE, W_WARM, W_ONCE,
# W_RATE, and W_CPU_FILE: the queries of fixed-rate run REP [1].
workload() {
	local q=$OUT/queries
	W_MODE=udp W_WARM=1 W_ONCE=0 W_RATE=$CPU_RATE W_RETRY_FILE=
	case $1 in
	hit1) W_FILE=$q/hit1.txt ;;
	hit20) W_FILE=$q/hit20.txt ;;
	nx1) W_FILE=$q/nx1.txt ;;
	names10k) W_FILE=$q/names10k.txt ;;
	tcphit) W_FILE=$q/hit1.txt W_MODE=tcp ;;
	unique | uniqext)
		W_FILE=$q/$1.txt W_RETRY_FILE=$q/$1-retry.txt W_WARM=0 W_ONCE=1 W_RATE=$MISS_CPU_RATE
		W_CPU_FILE=$q/$1-cpu-${2:-1}.txt
		return 0
		;;
	*) die "unknown workload $1" ;;
	esac
	W_CPU_FILE=$W_FILE
	return 0
}

# --------------------------------------------------------------- measuring

# cpu_ns PID: CPU time of PID so far in ns of scheduler time (bench/cpuns:
# the process's CPU clock, every thread including exited ones, plus the
# children it forked); the fixed-rate runs divide its growth by the queries.
cpu_ns() {
	"$BIN/cpuns" "$1" | awk '$2 != "gone" { print $2 }'
}

# cpu_ticks PID: utime+stime (+ reaped children: dnsmasq forks for TCP).
cpu_ticks() {
	awk '{ print $14 + $15 + $16 + $17 }' "/proc/$1/stat"
}

rss_kb() {
	awk '$1 == "VmRSS:" { print $2 }' "/proc/$1/status"
}

hwm_kb() {
	awk '$1 == "VmHWM:" { print $2 }' "/proc/$1/status"
}

# core_busy CORE: user+nice+system+steal jiffies of CORE so far: steal is
# time the hypervisor gave to another machine; irq/softirq are left out, as
# they are the server's own packets as much as anyone's.
core_busy() {
	awk -v c="cpu$1" '$1 == c { print $2 + $3 + $4 + $9 }' /proc/stat
}

# child_ticks: CPU time of this shell's reaped children (dnsperf among them).
child_ticks() {
	awk '{ print $16 + $17 }' "/proc/$$/stat"
}

# share TICKS NANOSECONDS: TICKS in % of one core over that wall time, >= 0.
share() {
	awk -v t="$1" -v hz="$HZ" -v ns="$2" 'BEGIN { v = t / hz / (ns / 1e9) * 100; printf "%.0f", v < 0 ? 0 : v }'
}

# upstream_count: queries the test upstream has answered so far (UDP + TCP).
# It counts its own query too: the queries between two calls are the
# difference minus one (the first call's).
upstream_count() {
	dig +time=1 +tries=2 +short "@$NODE_RESOLVER" _stats.upstream.bench TXT |
		tr -d '"' | awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "udp" || kv[1] == "tcp") n += kv[2] } } END { print n + 0 }'
}

# dnsperf_run PORT MODE FILE OUTFILE ARGS...: dnsperf on the client core.
dnsperf_run() {
	local port=$1 mode=$2 file=$3 outf=$4
	shift 4
	taskset -c "$CLIENT_CORE" dnsperf -s "$LISTEN" -p "$port" -m "$mode" -d "$file" \
		-c "$CLIENTS" -q "$OUTSTANDING" "$@" >"$outf" 2>&1 || true
}

# stat FILE KEY: a number from dnsperf's summary.
stat_of() {
	awk -v k="$2" 'index($0, k) { sub(/.*:[ \t]*/, ""); print $1; exit }' "$1"
}

# run_qps SERVER PID WORKLOAD: the unlimited-rate part of a workload (warmed
# first when it hits): QPS, lost, forwarded and other work, left in
# bench/out/SERVER/WORKLOAD.qps.tsv for write_row.
run_qps() {
	local s=$1 pid=$2 w=$3 port=${PORT[$1]} dir=$OUT/$1
	workload "$w"
	if ((W_WARM)); then
		dnsperf_run "$port" udp "$W_FILE" "$dir/$w.warm.txt" -n 1
	fi
	local once=()
	((W_ONCE)) && once=(-n 1)

	# Unlimited rate: QPS and lost queries. Other work on either core (this
	# machine is shared) is measured: on the server core all but the server,
	# on the client core all but dnsperf (reaped by this shell) and the
	# upstream. A run it disturbed by more than 10% of a core is measured once
	# more and the quieter run kept.
	local up0 up1 try noise noise0 noise1 best_noise=101 t0 t1 b0 b1 c0 c1 k0 k1 d0 d1 u0 u1 file=$W_FILE
	for try in 1 2; do
		up0=$(upstream_count)
		b0=$(core_busy "$SERVER_CORE") c0=$(cpu_ticks "$pid") t0=$(date +%s%N)
		k0=$(core_busy "$CLIENT_CORE") d0=$(child_ticks) u0=$(cpu_ticks "$UPSTREAM")
		dnsperf_run "$port" "$W_MODE" "$file" "$dir/$w.qps.try.txt" -l "$DURATION" "${once[@]}"
		b1=$(core_busy "$SERVER_CORE") c1=$(cpu_ticks "$pid") t1=$(date +%s%N)
		k1=$(core_busy "$CLIENT_CORE") d1=$(child_ticks) u1=$(cpu_ticks "$UPSTREAM")
		up1=$(upstream_count)
		noise0=$(share $((b1 - b0 - (c1 - c0))) $((t1 - t0)))
		noise1=$(share $((k1 - k0 - (d1 - d0) - (u1 - u0))) $((t1 - t0)))
		noise=$((noise0 > noise1 ? noise0 : noise1))
		if ((noise < best_noise)); then
			best_noise=$noise
			mv "$dir/$w.qps.try.txt" "$dir/$w.qps.txt"
			echo "$((up1 - up0 - 1))" >"$dir/$w.upstream"
		fi
		# Names asked once must not be asked again: the second try of such a
		# workload takes a second set.
		# A smoke run only proves the pipeline: it never measures twice.
		if ((noise <= MAX_NOISE || try == 2 || QUICK)) || [[ $W_ONCE == 1 && -z $W_RETRY_FILE ]]; then
			break
		fi
		if ((W_ONCE)); then file=$W_RETRY_FILE; fi
		log "$s $w: other work took ${noise0}% of the server core, ${noise1}% of the client core; measuring again"
	done
	rm -f "$dir/$w.qps.try.txt"
	noise=$best_noise
	local qps sent lost completed fwd
	qps=$(stat_of "$dir/$w.qps.txt" "Queries per second")
	sent=$(stat_of "$dir/$w.qps.txt" "Queries sent")
	lost=$(stat_of "$dir/$w.qps.txt" "Queries lost")
	completed=$(stat_of "$dir/$w.qps.txt" "Queries completed")
	fwd=$(cat "$dir/$w.upstream")
	printf '%s\t%s\t%s\t%s\t%s\t%s\n' "${qps:-n/a}" "${sent:-n/a}" "${completed:-n/a}" "${lost:-n/a}" "$fwd" "$noise" >"$dir/$w.qps.tsv"
	log "$(printf '%-12s %-9s %8.0f qps  lost %s  forwarded %s  other work %s%%' \
		"$s" "$w" "${qps:-0}" "${lost:-n/a}" "$fwd" "$noise")"
}

# run_cpu SERVER PID WORKLOAD REP: fixed-rate run REP of a workload: the
# server's CPU per query and the latencies (per-query output from -v), the
# other work on both cores meanwhile (as in run_qps), so a disturbed run
# shows, and the queries it forwarded (all of them on a miss workload); one
# line of reps.tsv.
run_cpu() {
	local s=$1 pid=$2 w=$3 rep=$4 port=${PORT[$1]} dir=$OUT/$1
	workload "$w" "$rep"
	local once=() f=$dir/$w.cpu-$rep
	((W_ONCE)) && once=(-n 1)
	local cpu_done cpu_lost lat c0 c1 t0 t1 b0 b1 s0 s1 k0 k1 d0 d1 u0 u1 noise noise0 noise1 up0 up1
	sleep 0.5 # let the previous run's work (GC, TCP teardown) settle
	up0=$(upstream_count)
	"$BIN/cpuns" "$pid" >"$f.cpuns"
	c0=$(cpu_ns "$pid")
	b0=$(core_busy "$SERVER_CORE") s0=$(cpu_ticks "$pid") t0=$(date +%s%N)
	k0=$(core_busy "$CLIENT_CORE") d0=$(child_ticks) u0=$(cpu_ticks "$UPSTREAM")
	dnsperf_run "$port" "$W_MODE" "$W_CPU_FILE" "$f.txt" -l "$CPU_DURATION" -Q "$W_RATE" -v "${once[@]}"
	sleep 0.5 # let the server finish (and reap TCP children)
	b1=$(core_busy "$SERVER_CORE") s1=$(cpu_ticks "$pid") t1=$(date +%s%N)
	k1=$(core_busy "$CLIENT_CORE") d1=$(child_ticks) u1=$(cpu_ticks "$UPSTREAM")
	c1=$(cpu_ns "$pid")
	"$BIN/cpuns" "$pid" >>"$f.cpuns"
	up1=$(upstream_count)
	local fwd=$((up1 - up0 - 1))
	noise0=$(share $((b1 - b0 - (s1 - s0))) $((t1 - t0)))
	noise1=$(share $((k1 - k0 - (d1 - d0) - (u1 - u0))) $((t1 - t0)))
	noise=$((noise0 > noise1 ? noise0 : noise1))
	cpu_done=$(stat_of "$f.txt" "Queries completed")
	cpu_lost=$(stat_of "$f.txt" "Queries lost")
	lat=$(awk '/^> / { print $NF }' "$f.txt" | sort -g |
		awk '{ v[NR] = $1; s += $1 } END { if (NR == 0) { print "n/a n/a n/a"; exit }
			i = int(NR * 0.99); if (i < 1) i = 1; j = int(NR * 0.5); if (j < 1) j = 1
			printf "%.3f %.3f %.3f\n", s / NR * 1000, v[j] * 1000, v[i] * 1000 }')
	# Keep only the summary of the per-query output.
	grep -v '^> ' "$f.txt" >"$f.summary.txt" || true
	rm -f "$f.txt"
	local cpu_us=n/a
	if [[ -n $cpu_done && $cpu_done -gt 0 && -n $c0 && -n $c1 ]]; then
		cpu_us=$(awk -v t=$((c1 - c0)) -v n="$cpu_done" 'BEGIN { printf "%.2f", t / 1e3 / n }')
	fi
	local lat_avg lat_p50 lat_p99
	read -r lat_avg lat_p50 lat_p99 <<<"$lat"
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$s" "$w" "$rep" "$cpu_us" \
		"$lat_avg" "$lat_p50" "$lat_p99" "${cpu_lost:-n/a}" "$noise" "$noise0" "$noise1" \
		"${cpu_done:-n/a}" "$fwd" >>"$OUT/reps.tsv"
	log "$(printf '%-12s %-9s rep %d/%d  cpu %s us/q  p50 %s ms  p99 %s ms  lost %s  forwarded %s/%s  other work %s%%' \
		"$s" "$w" "$rep" "$CPU_REPS" "$cpu_us" "$lat_p50" "$lat_p99" "${cpu_lost:-n/a}" "$fwd" "${cpu_done:-n/a}" "$noise")"
}

# disturbed SERVER WORKLOAD REPS: how many of the first REPS fixed-rate runs
# other work took more than MAX_NOISE % of a core from.
disturbed() {
	awk -F'\t' -v s="$1" -v w="$2" -v r="$3" -v m="$MAX_NOISE" '$1 == s && $2 == w && $3 <= r && $9 > m { n++ } END { print n + 0 }' "$OUT/reps.tsv"
}

# median SERVER WORKLOAD COLUMN DECIMALS: the median of a reps.tsv column over
# that server's quiet runs of the workload (other work ≤ MAX_NOISE %; all
# runs when none was quiet), the mean of the middle two when even, n/a when
# no run has a figure there.
median() {
	awk -F'\t' -v s="$1" -v w="$2" -v c="$3" -v m="$MAX_NOISE" '$1 == s && $2 == w { all[++n] = $c; if ($9 <= m) quiet[++k] = $c }
		END { if (k) for (i = 1; i <= k; i++) print quiet[i]; else for (i = 1; i <= n; i++) print all[i] }' "$OUT/reps.tsv" |
		awk '$1 != "n/a"' |
		sort -g | awk -v p="$4" '{ v[NR] = $1 } END {
			if (NR == 0) { print "n/a"; exit }
			m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
			printf "%." p "f\n", m }'
}

# write_row SERVER WORKLOAD: its row of results.tsv: the unlimited-rate
# figures, the medians of the fixed-rate runs' CPU/query, avg, p50 and p99
# (each column's own median), their lost queries summed, and how many fixed-
# rate runs there were (the last column: files without it had one).
write_row() {
	local s=$1 w=$2 dir=$OUT/$1 qps sent completed lost fwd noise cpu_us avg p50 p99 cpu_lost n
	IFS=$'\t' read -r qps sent completed lost fwd noise <"$dir/$w.qps.tsv"
	workload "$w"
	cpu_us=$(median "$s" "$w" 4 2)
	avg=$(median "$s" "$w" 5 3)
	p50=$(median "$s" "$w" 6 3)
	p99=$(median "$s" "$w" 7 3)
	read -r cpu_lost n < <(awk -F'\t' -v s="$s" -v w="$w" '$1 == s && $2 == w { n++; if ($8 != "n/a") { l += $8; k++ } }
		END { printf "%s %d\n", k ? l : "n/a", n }' "$OUT/reps.tsv")
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$s" "$w" "$qps" "$sent" \
		"$completed" "$lost" "$fwd" "$W_RATE" "$cpu_lost" "$cpu_us" \
		"$avg" "$p50" "$p99" "$noise" "$n" >>"$OUT/results.tsv"
	log "$(printf '%-12s %-9s %8s qps  lost %s  median of %d: cpu %s us/q  p99 %s ms  forwarded %s  other work %s%%' \
		"$s" "$w" "${qps%.*}" "$lost/$cpu_lost" "$n" "$cpu_us" "$p99" "$fwd" "$noise")"
}

# --------------------------------------------------------------- the servers

# In a directory of its own: nodelocaldns watches resolv.conf's directory
# (inotify), and nothing the bench writes while a server runs may wake it.
write_resolv_conf() {
	mkdir -p "$OUT/etc"
	printf 'nameserver %s\n' "$NODE_RESOLVER" >"$OUT/etc/resolv.conf"
}

# start_server NAME: starts it, sets SPID; false when it could not start.
start_server() {
	local s=$1 dir=$OUT/$1 port=${PORT[$1]}
	mkdir -p "$dir"
	port_free "$port" || {
		log "$s: port $port is in use"
		return 1
	}
	local nld=$BIN/nodelocaldns
	case $s in
	nodelocaldns | previous)
		if [[ $s == previous ]]; then
			[[ $PREV_STATUS == ok ]] || return 1
			nld=$BIN/nodelocaldns-$PREV_COMMIT
		fi
		[[ $NLD_STATUS == ok ]] || return 1
		# A state directory of its own, empty at every start, on a tmpfs as
		# the manifest's /run is: every start is cold (a cache snapshot the
		# last run left would make the next phase's misses hits), and the
		# snapshot is written as in production, its cost in the row.
		local state=/dev/shm/nld-bench-$s
		[[ -d /dev/shm ]] || state=$dir/state
		rm -rf "$state" && mkdir -p "$state"
		# shellcheck disable=SC2086 # extra flags split on purpose
		spawn "$dir/server.log" "$SERVER_CORE" "$nld" \
			-localip "$LISTEN" -port "$port" -kube-dns "$KUBE_DNS:53" \
			-resolv-conf "$OUT/etc/resolv.conf" -setupinterface=false -setupiptables=false \
			-metrics-listen-address "$LISTEN:${MPORT[$s]}" -health-port "${HPORT[$s]}" \
			-state-dir "$state" -cluster-domain cluster.local ${BENCH_NODELOCALDNS_ARGS:-}
		;;
	coredns)
		write_corefile "$dir/Corefile" "$port" "$s"
		spawn "$dir/server.log" "$SERVER_CORE" "$BIN/coredns-$COREDNS_VERSION" -conf "$dir/Corefile"
		;;
	node-local-dns)
		# The real stock binary on the same Corefile as CoreDNS's row, with
		# the DaemonSet's flags less what needs a node (interface,
		# iptables); -basecorefile names a file that does not exist, in an
		# empty directory (node-cache reads the directory it is in), so
		# -conf is used as written.
		[[ $STOCK_STATUS == ok ]] || return 1
		mkdir -p "$dir/base"
		write_corefile "$dir/Corefile" "$port" "$s"
		spawn "$dir/server.log" "$SERVER_CORE" "$BIN/node-cache" -localip "$LISTEN" \
			-conf "$dir/Corefile" -basecorefile "$dir/base/Corefile.base" \
			-setupinterface=false -setupiptables=false -skipteardown \
			-health-port "${HPORT[$s]}" -metrics-listen-address "$LISTEN:$STOCK_MPORT"
		;;
	unbound)
		write_unbound_conf "$dir/unbound.conf" "$port" "$dir"
		spawn "$dir/server.log" "$SERVER_CORE" unbound -d -c "$dir/unbound.conf"
		;;
	dnsmasq)
		# -k: foreground but otherwise as in production (-d would also stop
		# it forking for TCP connections). 10000: its historical maximum, about
		# the stock 9984; larger caches make dnsmasq slower once full. 64 TCP
		# connections: the default 20 would leave 12 of dnsperf's 32 unserved.
		spawn "$dir/server.log" "$SERVER_CORE" dnsmasq -k --conf-file=/dev/null \
			--no-resolv --no-hosts --no-poll --log-facility=- --user=root \
			--pid-file="$dir/dnsmasq.pid" --listen-address="$LISTEN" --bind-interfaces \
			--port="$port" --cache-size=10000 --max-tcp-connections=64 \
			--server=/cluster.local/"$KUBE_DNS" --server=/in-addr.arpa/"$KUBE_DNS" \
			--server=/ip6.arpa/"$KUBE_DNS" --server="$NODE_RESOLVER"
		;;
	ceiling)
		spawn "$dir/server.log" "$SERVER_CORE" "$BIN/upstream" -listen "$LISTEN:$port"
		;;
	limit)
		spawn "$dir/server.log" "$SERVER_CORE" "$BIN/limit" "$LISTEN" "$port"
		;;
	esac
	SPID=$SPAWNED
	if ! ready "$LISTEN" "$port" "$SPID"; then
		log "$s: did not answer within 20 s; log: $dir/server.log"
		tail -5 "$dir/server.log" >&2 || true
		stop "$SPID"
		return 1
	fi
}

port_free() {
	! ss -Hlnu "sport = :$1" 2>/dev/null | grep -q . && ! ss -Hlnt "sport = :$1" 2>/dev/null | grep -q .
}

# The stock node-local-dns Corefile (kubernetes cluster/addons/dns/nodelocaldns),
# with its pillars filled in for loopback: write_corefile FILE PORT SERVER
# (SERVER's metrics and health ports).
write_corefile() {
	local f=$1 port=$2 s=$3 zone
	{
		cat <<EOF
cluster.local:$port {
    errors
    cache {
        success 9984 30
        denial 9984 5
    }
    reload
    loop
    bind $LISTEN
    forward . $KUBE_DNS {
        force_tcp
    }
    prometheus $LISTEN:${MPORT[$s]}
    health $LISTEN:${HPORT[$s]}
}
EOF
		for zone in in-addr.arpa ip6.arpa; do
			cat <<EOF
$zone:$port {
    errors
    cache 30
    reload
    loop
    bind $LISTEN
    forward . $KUBE_DNS {
        force_tcp
    }
    prometheus $LISTEN:${MPORT[$s]}
}
EOF
		done
		cat <<EOF
.:$port {
    errors
    cache 30
    reload
    loop
    bind $LISTEN
    forward . $OUT/etc/resolv.conf
    prometheus $LISTEN:${MPORT[$s]}
}
EOF
	} >"$f"
}

# Unbound as a forwarding node cache: no validation, one thread (one core),
# the cluster domain and reverse zones to kube-dns over TCP as the others do.
write_unbound_conf() {
	local f=$1 port=$2 dir=$3 zone
	{
		cat <<EOF
server:
    interface: $LISTEN@$port
    port: $port
    do-daemonize: no
    num-threads: 1
    use-syslog: no
    logfile: ""
    chroot: ""
    username: ""
    pidfile: ""
    directory: "$dir"
    verbosity: 0
    access-control: 127.0.0.0/8 allow
    module-config: "iterator"
    do-not-query-localhost: no
    unblock-lan-zones: yes
    insecure-lan-zones: yes
    # 32 dnsperf TCP clients: the default of 10 would queue them.
    incoming-num-tcp: 64
    outgoing-num-tcp: 16
EOF
		for zone in cluster.local in-addr.arpa ip6.arpa; do
			cat <<EOF
forward-zone:
    name: "$zone."
    forward-addr: $KUBE_DNS@53
    forward-tcp-upstream: yes
EOF
		done
		cat <<EOF
forward-zone:
    name: "."
    forward-addr: $NODE_RESOLVER@53
EOF
	} >"$f"
}

# Every server runs for the whole workload phase, all pinned to the server
# core (idle ones cost nothing), and each workload is measured on each server
# in turn: a burst of other work on this shared machine then hits one
# workload of every server rather than every workload of one server. Within
# a workload the fixed-rate runs are interleaved too (rep 1 of every server,
# then rep 2 of every server, ...), so a burst hits one rep of one server,
# and the median of each server's reps leaves it out.
declare -A RUNNING=() # server -> pid

start_all() {
	local s why
	for s in $SERVERS; do
		if start_server "$s"; then
			RUNNING[$s]=$SPID
			printf '%s\tstatus\tok\n' "$s" >>"$OUT/status.tsv"
			log "$s: started (pid $SPID, port ${PORT[$s]})"
		else
			why="n/a: did not start (see bench/out/$s/server.log)"
			if [[ $s == nodelocaldns && $NLD_STATUS != ok ]]; then why=$NLD_STATUS; fi
			if [[ $s == node-local-dns && $STOCK_STATUS != ok ]]; then why=$STOCK_STATUS; fi
			if [[ $s == previous && $PREV_STATUS != ok ]]; then why=$PREV_STATUS; fi
			printf '%s\tstatus\t%s\n' "$s" "$why" >>"$OUT/status.tsv"
			log "$s: $why"
		fi
	done
}

# alive SERVER WORKLOAD: true while the server runs; if it has exited, says
# so in status.tsv and forgets it.
alive() {
	local s=$1 w=$2
	[[ -v "RUNNING[$s]" ]] || return 1
	kill -0 "${RUNNING[$s]}" 2>/dev/null && return 0
	log "$s: exited during the run; log: $OUT/$s/server.log"
	printf '%s\tstatus\tn/a: exited during %s (see bench/out/%s/server.log)\n' "$s" "$w" "$s" >>"$OUT/status.tsv"
	unset "RUNNING[$s]"
	return 1
}

run_all() {
	local w s rep i n
	local -a measured order
	for w in $WORKLOADS; do
		measured=()
		for s in $SERVERS; do
			alive "$s" "$w" || continue
			workload "$w"
			run_qps "$s" "${RUNNING[$s]}" "$w"
			measured+=("$s")
		done
		# Each rep starts one server further along the list: the slot
		# right after the unlimited-rate runs (which leave the most work
		# behind: GC, TCP teardown, the upstream's) and the slot last in
		# a rep fall to a different server each time, not always the same.
		n=${#measured[@]}
		for rep in $(seq 1 "$CPU_REPS"); do
			order=()
			for ((i = 0; i < n; i++)); do
				order+=("${measured[(i + rep - 1) % n]}")
			done
			for s in "${order[@]}"; do
				alive "$s" "$w" || continue
				run_cpu "$s" "${RUNNING[$s]}" "$w" "$rep"
			done
		done
		# A rep that other work disturbed (over MAX_NOISE % of a core) is run
		# once more at the end, one extra run per disturbed rep, the servers
		# interleaved again; the medians leave disturbed reps out when a
		# quiet one exists.
		for ((i = 1; i <= EXTRA_REPS; i++)); do
			for s in "${measured[@]}"; do
				alive "$s" "$w" || continue
				(($(disturbed "$s" "$w" "$CPU_REPS") >= i)) || continue
				log "$s $w: $(disturbed "$s" "$w" "$CPU_REPS") of $CPU_REPS fixed-rate runs disturbed; extra run $i"
				run_cpu "$s" "${RUNNING[$s]}" "$w" $((CPU_REPS + i))
			done
		done
		for s in "${measured[@]}"; do
			write_row "$s" "$w"
		done
	done
	for s in $SERVERS; do
		[[ -v "RUNNING[$s]" ]] || continue
		hwm_kb "${RUNNING[$s]}" >"$OUT/$s/hwm"
		stop "${RUNNING[$s]}" "$s"
		unset "RUNNING[$s]"
	done
}

# measure_rss NAME: a fresh process, VmRSS after 10k and then 100k distinct names.
measure_rss() {
	local s=$1 pid r0 r10 r100 hwm
	[[ $s != ceiling && $s != limit && -f $OUT/$s/hwm ]] || return 0
	hwm=$(cat "$OUT/$s/hwm")
	start_server "$s" || return 0
	pid=$SPID
	r0=$(rss_kb "$pid")
	dnsperf_run "${PORT[$s]}" udp "$OUT/queries/rss10k.txt" "$OUT/$s/rss10k.txt" -n 1
	sleep 1
	r10=$(rss_kb "$pid")
	dnsperf_run "${PORT[$s]}" udp "$OUT/queries/rss100k.txt" "$OUT/$s/rss100k.txt" -n 1
	sleep 1
	r100=$(rss_kb "$pid")
	printf '%s\t%s\t%s\t%s\t%s\n' "$s" "$r0" "$r10" "$r100" "$hwm" >>"$OUT/rss.tsv"
	log "$s: RSS start ${r0} kB, 10k names ${r10} kB, 100k names ${r100} kB, peak under load ${hwm} kB"
	stop "$pid" "$s"
}

# ------------------------------------------------------------------- facts

write_facts() {
	local f=$OUT/facts.env nld_rev
	nld_rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "no commit")
	if [[ -n $(git -C "$ROOT" status --porcelain -- cmd internal go.mod 2>/dev/null) ]]; then
		nld_rev="$nld_rev + uncommitted changes"
	fi
	{
		echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
		echo "command=$COMMAND"
		echo "cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
		echo "cores=$(nproc)"
		echo "memory=$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
		echo "kernel=$(uname -sr)"
		echo "os=$(awk -F= '$1 == "PRETTY_NAME" { gsub(/"/, "", $2); print $2 }' /etc/os-release)"
		echo "go=$(go version | awk '{ print $3 }')"
		echo "dnsperf=$(dnsperf -h 2>&1 | awk '/^Version/ { print $2; exit }')"
		echo "unbound=$(unbound -V 2>/dev/null | awk '/^Version/ { print $2; exit }')"
		echo "dnsmasq=$(dnsmasq --version | awk 'NR == 1 { print $3 }')"
		echo "coredns=$("$BIN/coredns-$COREDNS_VERSION" -version | awk -F- 'NR == 1 { print $2 }')"
		if [[ $STOCK_STATUS == ok ]]; then
			echo "node_local_dns=k8s-dns-node-cache, $(awk '/^CoreDNS-/ { print; exit }' "$OUT/node-local-dns/server.log" 2>/dev/null), sha256 $(sha256sum "$BIN/node-cache" | cut -c1-12)"
		else
			echo "node_local_dns=$STOCK_STATUS"
		fi
		echo "nodelocaldns=$nld_rev"
		if [[ -n $PREVIOUS ]]; then
			if [[ $PREV_STATUS == ok ]]; then
				echo "previous=$PREVIOUS (${PREV_COMMIT:0:12})"
			else
				echo "previous=$PREV_STATUS"
			fi
		fi
		echo "nodelocaldns_status=$NLD_STATUS"
		echo "duration=$DURATION"
		echo "cpu_duration=$CPU_DURATION"
		echo "cpu_reps=$CPU_REPS"
		echo "cpu_rate=$CPU_RATE"
		echo "miss_cpu_rate=$MISS_CPU_RATE"
		echo "clients=$CLIENTS"
		echo "outstanding=$OUTSTANDING"
		echo "load_before=$LOAD_BEFORE"
		echo "load_after=$(cut -d' ' -f1-3 /proc/loadavg)"
		echo "quick=$QUICK"
		echo "elapsed=$SECONDS"
	} >"$f"
}

# -------------------------------------------------------------------- main

# common_setup PACKAGES...: packages, lock, tools, nodelocaldns, queries, upstream.
common_setup() {
	command -v go >/dev/null || die "go is not on PATH"
	[[ $(nproc) -ge 2 ]] || die "needs 2 cores (server on core 0, client on core 1)"
	need_packages dnsperf:dnsperf dig:bind9-dnsutils taskset:util-linux setsid:util-linux \
		flock:util-linux ss:iproute2 gcc:gcc "$@"
	mkdir -p "$CACHE/bin" "$OUT"
	exec 9>"$CACHE/run.lock"
	flock -n 9 || die "another bench run holds $CACHE/run.lock"
	rm -rf "${OUT:?}"/*
	HZ=$(getconf CLK_TCK)
	LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

	build_tools
	build_nodelocaldns
	log "nodelocaldns: $NLD_STATUS"
	gen_queries
	write_resolv_conf

	spawn "$OUT/upstream.log" "$CLIENT_CORE" "$BIN/upstream" -listen "$NODE_RESOLVER:53,$KUBE_DNS:53"
	UPSTREAM=$SPAWNED
	sleep 0.3
	kill -0 "$UPSTREAM" 2>/dev/null || die "test upstream did not start: $(cat "$OUT/upstream.log")"
	ready "$NODE_RESOLVER" 53 "$UPSTREAM" || die "test upstream did not start: $(cat "$OUT/upstream.log")"
	ready "$KUBE_DNS" 53 "$UPSTREAM" || die "test upstream did not start on $KUBE_DNS:53"
}

bench() {
	common_setup unbound:unbound dnsmasq:dnsmasq-base
	build_coredns
	build_stock
	log "node-local-dns (stock): $STOCK_STATUS"
	build_previous
	[[ -z $PREVIOUS ]] || log "previous build ($PREVIOUS): $PREV_STATUS"
	: >"$OUT/results.tsv"
	: >"$OUT/reps.tsv"
	: >"$OUT/rss.tsv"
	: >"$OUT/status.tsv"
	log "load average before: $LOAD_BEFORE (other work on this machine skews the numbers)"

	local s
	for s in $SERVERS; do
		[[ -v "PORT[$s]" ]] || die "unknown server $s"
	done
	start_all
	run_all
	if [[ $QUICK != 1 ]]; then
		for s in $SERVERS; do
			measure_rss "$s"
		done
	fi
	stop "$UPSTREAM"

	write_facts
	# A smoke run is no result: it stays in bench/out/.
	local dest=$BENCH_DIR
	if [[ $QUICK == 1 ]]; then dest=$OUT; fi
	"$BIN/report" -out "$OUT" -md "$dest/RESULTS.md" -png results.png -profile-dir "$BENCH_DIR" ${BENCH_BASELINE:+-baseline "$BENCH_BASELINE"}
	"$BIN/chart" -in "$OUT/results.tsv" -status "$OUT/status.tsv" -out "$dest/results.png"
	if [[ ${BENCH_AUTOPATH:-0} == 1 ]]; then
		autopath_workload "$dest/RESULTS.md"
	fi
	log "done in ${SECONDS}s: ${dest#"$ROOT"/}/RESULTS.md, ${dest#"$ROOT"/}/results.png"
}

# autopath_workload FILE: issue 15's workload (test/autopath
# TestAutopathBenchWorkload: a real kube-apiserver knows the pod, a network
# namespace is the pod, the daemon runs without then with -autopath);
# appends its result lines to FILE. Not pinned to cores like the rest.
autopath_workload() {
	local dur=${BENCH_AUTOPATH_DURATION:-$CPU_DURATION} rate=${BENCH_AUTOPATH_RATE:-500}
	mkdir -p "$OUT"
	log "autopath workload: ${dur}s at $rate lookups/s, without and with -autopath"
	(cd "$ROOT" && NLD_AUTOPATH_BENCH=1 NLD_AUTOPATH_BENCH_DURATION="${dur}s" NLD_AUTOPATH_BENCH_RATE="$rate" \
		NLD_AUTOPATH_BENCH_OUT="$OUT/autopath.txt" go test -count=1 -run TestAutopathBenchWorkload -v ./test/autopath) \
		>"$OUT/autopath.log" 2>&1 || die "autopath workload failed: $(tail -5 "$OUT/autopath.log")"
	{
		printf '\n## Autopath: a pod resolving external names (ndots:5, the kubelet search list)\n\n'
		printf '%s\n' '```' "$(cat "$OUT/autopath.txt")" '```'
	} >>"$1"
	cat "$OUT/autopath.txt" >&2
}

# profile_name WORKLOAD: the file name of its profile, bench/cpu-NAME.pprof.
profile_name() {
	case $1 in
	unique) echo miss-tcp ;;
	uniqext) echo miss-udp ;;
	*) echo "$1" ;;
	esac
}

# profile: nodelocaldns under dnsperf load, a CPU profile from its pprof
# endpoint per workload of PROFILE_WORKLOADS, each from a fresh daemon.
profile() {
	local workloads=${PROFILE_WORKLOADS:-unique uniqext} secs=${PROFILE_SECONDS:-15} w
	# Enough unique names for the whole profile at any miss rate seen here.
	DURATION=$((secs + 2))
	common_setup curl:curl
	[[ $NLD_STATUS == ok ]] || die "nodelocaldns: $NLD_STATUS"
	if ! "$BIN/nodelocaldns" -h 2>&1 | grep -q -- '-pprof'; then
		die "nodelocaldns has no -pprof flag: cannot serve /debug/pprof/"
	fi
	BENCH_NODELOCALDNS_ARGS="${BENCH_NODELOCALDNS_ARGS:-} -pprof"
	for w in $workloads; do
		profile_one "$w" "$secs"
	done
}

# profile_one WORKLOAD SECONDS
profile_one() {
	local w=$1 secs=$2 name
	name=cpu-$(profile_name "$w")
	start_server nodelocaldns || die "nodelocaldns did not start; log: $OUT/nodelocaldns/server.log"
	local pid=$SPID port=${PORT[nodelocaldns]} dir=$OUT/nodelocaldns
	workload "$w"
	if ((W_WARM)); then
		dnsperf_run "$port" udp "$W_FILE" "$dir/$w.warm.txt" -n 1
	fi
	local once=()
	((W_ONCE)) && once=(-n 1)
	log "profiling nodelocaldns for ${secs}s under $w load"
	spawn "$dir/$w.profile-load.txt" "$CLIENT_CORE" dnsperf -s "$LISTEN" -p "$port" -m "$W_MODE" \
		-d "$W_FILE" -c "$CLIENTS" -q "$OUTSTANDING" -l $((secs + 2)) "${once[@]}"
	local load=$SPAWNED c0 c1
	sleep 1
	c0=$(cpu_ns "$pid")
	curl -fsS -o "$BENCH_DIR/$name.pprof" \
		"http://$LISTEN:${MPORT[nodelocaldns]}/debug/pprof/profile?seconds=$secs" ||
		die "no profile from http://$LISTEN:${MPORT[nodelocaldns]}/debug/pprof/profile"
	c1=$(cpu_ns "$pid")
	wait_gone "$load" 30 || true
	grep -E 'Queries (sent|completed|lost)|per second' "$dir/$w.profile-load.txt" >&2 || true
	stop "$pid"
	{
		echo "Workload: $w, dnsperf -c $CLIENTS -q $OUTSTANDING, $(stat_of "$dir/$w.profile-load.txt" "Queries per second") qps while profiled;" \
			"server CPU $(awk -v t=$((c1 - c0)) -v s="$secs" 'BEGIN { printf "%.0f", t / 1e7 / s }')% of a core (scheduler time)"
		go tool pprof -top -nodecount=40 "$BIN/nodelocaldns" "$BENCH_DIR/$name.pprof" 2>/dev/null
	} >"$BENCH_DIR/$name.top.txt"
	head -30 "$BENCH_DIR/$name.top.txt"
	log "wrote bench/$name.pprof and bench/$name.top.txt (go tool pprof -http=: $BIN/nodelocaldns bench/$name.pprof)"
}

# One compound command ending in exit: bash has parsed all of it before it
# runs, so editing this file during a run cannot change the run.
{
	case ${1:-bench} in
	bench) bench ;;
	profile)
		OUT=$BENCH_DIR/out/profile # keep the last bench's raw output
		profile
		;;
	autopath)
		mkdir -p "$OUT" && : >"$OUT/autopath.md"
		autopath_workload "$OUT/autopath.md"
		;;
	*) die "usage: $0 [bench|profile|autopath]" ;;
	esac
	exit
}
