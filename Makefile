# leasehold — make targets. `make test` is the command CI runs (via .ci/run).
GO        ?= go
TOOL      := $(GO) tool -modfile=tools/go.mod
PKGS      := ./...
BIN       := bin/leasehold

.PHONY: image cluster-up cluster-down all build test test-race test-short verify fmt vet lint tidy-check generate generate-check fuzz bench postgres run clean

all: build

build: ## build the leasehold binary (static, no cgo)
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN) ./cmd/leasehold

run: build ## run a single node with default settings
	./$(BIN) server

test: ## every test, with the race detector (what CI runs)
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

test-race: test

test-short: ## quick run without the race detector and without the process-level suites
	$(GO) test -count=1 -short $(PKGS)

verify: fmt vet tidy-check generate-check lint ## everything a reviewer would check

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

lint:
	$(TOOL) golangci-lint run $(PKGS)

tidy-check:
	$(GO) mod tidy -diff

generate: ## regenerate Go code from proto/ (buf and plugins pinned in tools/go.mod)
	$(TOOL) buf lint
	$(TOOL) buf generate

generate-check: generate
	@git diff --exit-code -- api/ || (echo "generated code is stale: run make generate and commit"; exit 1)

fuzz: ## run every fuzz target for FUZZTIME each (default 30s)
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $${FUZZTIME:-30s} $$pkg || exit 1; \
	  done; \
	done

bench: ## the benchmarks behind docs/PERFORMANCE.md
	$(GO) test -run '^$$' -bench . -benchtime 5s -count 1 ./bench/... ./core/...

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
