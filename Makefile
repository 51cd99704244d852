# The README's commands. `make test` is what .ci/run runs.
GO ?= go
FUZZTIME ?= 5s

.PHONY: test run lint bench profile e2e

test:
	$(GO) test -race -count=1 ./...
	$(GO) test -run '^$$' -fuzz '^FuzzQueryPath$$' -fuzztime $(FUZZTIME) ./internal/cache
	$(GO) test -run '^$$' -fuzz '^FuzzBuild$$' -fuzztime $(FUZZTIME) ./internal/cache
	$(GO) test -run '^$$' -fuzz '^FuzzParseQuery$$' -fuzztime $(FUZZTIME) ./internal/wire

run:
	$(GO) run ./cmd/nodelocaldns -local-mode -localip 127.0.0.1 -port 5353

lint:
	gofmt -l $$(git ls-files '*.go')
	$(GO) vet ./...
	staticcheck ./...

bench:
	bench/run.sh

profile:
	bench/profile.sh

# A real single-node cluster on this machine (root; docs/e2e.md).
e2e:
	test/e2e/run.sh
