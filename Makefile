# The README's commands. `make test` is what .ci/run runs.
GO ?= go
# A count, not a duration: with a duration Go 1.26's fuzz coordinator can
# report a spurious "context deadline exceeded" when the time runs out while a
# worker is mid-input (golang/go#75804, fixed in Go 1.27); a count has no
# deadline. 150000 inputs take 3-13 s per target here.
FUZZTIME ?= 150000x

.PHONY: test run lint bench bench-quick bench-miss profile e2e conformance

# -timeout: test/dropin runs both oracles beside us for every directive and
# distribution (5-9 min on a loaded 2-core machine), near go test's 10 min.
test:
	$(GO) test -race -count=1 -timeout 30m ./...
	$(GO) test -run '^$$' -fuzz '^FuzzQueryPath$$' -fuzztime $(FUZZTIME) ./internal/cache
	$(GO) test -run '^$$' -fuzz '^FuzzBuild$$' -fuzztime $(FUZZTIME) ./internal/cache
	$(GO) test -run '^$$' -fuzz '^FuzzImport$$' -fuzztime $(FUZZTIME) ./internal/cache
	$(GO) test -run '^$$' -fuzz '^FuzzShuffle$$' -fuzztime $(FUZZTIME) ./internal/loadbalance
	$(GO) test -run '^$$' -fuzz '^FuzzParseQuery$$' -fuzztime $(FUZZTIME) ./internal/wire
	$(GO) test -run '^$$' -fuzz '^FuzzCheckMessage$$' -fuzztime $(FUZZTIME) ./internal/wire
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./internal/corefile
	$(GO) test -run '^$$' -fuzz '^FuzzAppend$$' -fuzztime $(FUZZTIME) ./internal/whoami
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./internal/dnstap
	$(GO) test -run '^$$' -fuzz '^FuzzCollect$$' -fuzztime $(FUZZTIME) ./internal/dnstap

run:
	$(GO) run ./cmd/nodelocaldns -local-mode -localip 127.0.0.1 -port 5353

lint:
	gofmt -l $$(git ls-files '*.go')
	$(GO) vet ./...
	staticcheck ./...

bench:
	bench/run.sh

# A smoke run of the bench: proves the pipeline, writes only bench/out/.
bench-quick:
	BENCH_QUICK=1 bench/run.sh

# The miss path's Go benchmarks (no root, no dnsperf).
bench-miss:
	$(GO) test -run '^$$' -bench '^BenchmarkMiss' -benchmem ./internal/daemon

profile:
	bench/profile.sh

# A real single-node cluster on this machine (root; docs/e2e.md).
e2e:
	test/e2e/run.sh

# Kubernetes' own DNS specs on the e2e cluster through the cache: ours, ours
# with -autopath, the stock node-local-dns (root; docs/conformance.md).
# NLD_E2E_LOCK=/path holds that lock only while the cluster is up.
conformance:
	test/conformance/run.sh
