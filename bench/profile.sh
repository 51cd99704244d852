#!/usr/bin/env bash
# bench/profile.sh (make profile): CPU profile of nodelocaldns under dnsperf
# load; writes bench/cpu.pprof and bench/cpu.top.txt. See bench/run.sh.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" profile "$@"
