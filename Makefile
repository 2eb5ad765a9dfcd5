# leasehold — make targets. `make test` is the command CI runs (via .ci/run).
GO        ?= go
TOOL      := $(GO) tool -modfile=tools/go.mod
PKGS      := ./...
BIN       := bin/leasehold

.PHONY: image cluster-up cluster-down all build test test-race test-short verify fmt vet lint tidy-check cross generate generate-check fuzz bench postgres run clean

all: build

build: ## build the leasehold binary (static, no cgo)
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN) ./cmd/leasehold

run: build ## run a single node with default settings
	./$(BIN) server

test: ## every test, with the race detector (what CI runs), the core's property tests in full without it, and the benchmark module's tests
	$(GO) test -race -count=1 -timeout 20m $(PKGS)
	$(GO) test -count=1 -timeout 10m -run 'Property' ./core/
	cd bench && $(GO) test -race -count=1 -timeout 5m ./...

test-race: test

test-short: ## quick run without the race detector and without the process-level suites
	$(GO) test -count=1 -short $(PKGS)

verify: fmt vet tidy-check generate-check lint cross ## everything a reviewer would check

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

lint:
	$(TOOL) golangci-lint run $(PKGS)

# What users build on other systems (README, Platforms): the packages an application
# imports (client, fence and the API) on every system Go runs on, their tests included;
# the leasehold binary on macOS and FreeBSD too. Tests and the benchmark tooling run on
# Linux only.
LIBS := ./api/... ./client/... ./fence/... ./core/... ./fastlane/...
cross:
	@for os in windows darwin freebsd; do \
	  echo "GOOS=$$os go vet (the libraries)"; GOOS=$$os $(GO) vet $(LIBS) || exit 1; done
	@for os in darwin freebsd; do \
	  echo "GOOS=$$os go build ./cmd/leasehold"; GOOS=$$os $(GO) build -o /dev/null ./cmd/leasehold || exit 1; done

tidy-check:
	$(GO) mod tidy -diff
	cd bench && $(GO) mod tidy -diff && $(GO) vet ./...

generate: ## regenerate Go code from proto/ (buf and plugins pinned in tools/go.mod)
	$(TOOL) buf lint
	$(TOOL) buf generate

generate-check: generate
	@git diff --exit-code -- api/ || (echo "generated code is stale: run make generate and commit"; exit 1)

fuzz: ## run every fuzz target for FUZZTIME each (default 30s; 20000x counts runs instead), minimizing a new input for up to FUZZMINTIME (default 60s)
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $${FUZZTIME:-30s} -fuzzminimizetime $${FUZZMINTIME:-60s} $$pkg || exit 1; \
	  done; \
	done

bench: ## the benchmarks behind docs/PERFORMANCE.md: Go benchmarks, then leasehold vs Redis, etcd and ZooKeeper (make bench-peers-install first) and the scale runs; tables and chart in bench/out/ (extra flags: BENCH_ARGS=...)
	$(GO) test -run '^$$' -bench . -benchtime 5s -count 1 ./core/...
	cd bench && $(GO) test -run '^$$' -bench . -benchtime 5s -count 1 -timeout 30m ./...
	cd bench && $(GO) run ./cmd/lockbench -root .. -out out -name lockbench -scenarios all -duration 10s -warmup 2s -timeout 90m $(BENCH_ARGS)

postgres: ## install (Debian) and start PostgreSQL for the fence tests; prints the env to export
	@bash scripts/postgres.sh

image: build ## a FROM-scratch image leasehold:dev from the static binary (no pull)
	docker build -t leasehold:dev .

cluster-up: image ## three nodes with docker compose (API on 127.0.0.1:17740, :27740, :37740)
	docker-compose -p leasehold -f compose.yaml up -d
	@echo "export LEASEHOLD_ADDR=127.0.0.1:17740,127.0.0.1:27740,127.0.0.1:37740"

cluster-down: ## stop the compose cluster (data volumes are kept)
	docker-compose -p leasehold -f compose.yaml down

clean:
	rm -rf bin

.PHONY: bench-quick bench-peers-install

bench-quick: ## about three minutes: uncontended W=1, 16 and 64 and contended; leasehold both classes with both recipes (Sessions on a shared client, a client per worker), Redis both modes through go-redis and rueidis, etcd and ZooKeeper when installed; results in bench/out/quick.*
	cd bench && $(GO) run ./cmd/lockbench -root .. -out out -name quick -systems leasehold-efficiency,leasehold-efficiency-per-worker,leasehold-correctness,leasehold-correctness-per-worker,redis-mem,redis-mem-rueidis,redis-aof,redis-aof-rueidis,etcd,zookeeper -scenarios uncontended-1,uncontended-16,uncontended-64,contended-16 -duration 2s -warmup 1s -timeout 15m $(BENCH_ARGS)

bench-peers-install: ## install the benchmark's peers from Debian: redis-server (7), etcd-server, zookeeper (pulls a JRE); the benchmark runs its own servers, never the packages' services
	$$( [ "$$(id -u)" -eq 0 ] || echo sudo ) apt-get update
	$$( [ "$$(id -u)" -eq 0 ] || echo sudo ) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server etcd-server zookeeper

# ---- nemesis: faults against a real three-node cluster (test/nemesis) ---------------------
# Partitions need root (network namespaces); without root they are left out with a warning.
NEMESIS_DURATION ?= 10m

.PHONY: nemesis failover-bench

nemesis: ## long nemesis run: NEMESIS_DURATION (default 10m) of faults + workload, then the checks; NEMESIS_SEED=... reproduces a schedule
	NEMESIS_DURATION=$(NEMESIS_DURATION) $(GO) test -count=1 -v -timeout 0 -run '^TestNemesisLong$$' ./test/nemesis/

FAILOVER_ROUNDS ?= 30

failover-bench: ## kill -9 of the leader → first correctness grant, FAILOVER_ROUNDS (default 30) kills: each round's steps, p50/p90/p99/max
	LEASEHOLD_FAILOVER_BENCH=1 LEASEHOLD_FAILOVER_ROUNDS=$(FAILOVER_ROUNDS) $(GO) test -count=1 -v -timeout 20m -run '^TestFailoverTime$$' ./test/nemesis/
