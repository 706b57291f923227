# The inbox library. `make help` lists the targets.

GO       ?= go
SERVICES := scripts/with-services.sh
# ./... stops at a nested module: the otel module (its own go.mod, tied in
# by go.work) is listed too, so every target covers it.
PKGS     := ./... ./otel/...

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: demo
demo: ## Run the demo: SQLite and an in-process Kafka broker, nothing to install.
	$(GO) run ./cmd/inbox-demo

.PHONY: test
test: ## Run every test against real PostgreSQL, MariaDB, SQLite and Kafka (started and stopped here); no backend may be skipped.
	$(SERVICES) --postgres --mariadb --kafka -- env INBOX_REQUIRE_BACKENDS=1 $(GO) test -race -count=1 -timeout 45m $(PKGS)

.PHONY: test-short
test-short: ## Run the tests that need no server (backends are skipped; not for CI).
	$(GO) test -race -count=1 $(PKGS)

.PHONY: lint
lint: ## gofmt, go vet, and the library, commands and tests building without cgo (no SQLite there).
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	CGO_ENABLED=0 $(GO) build $(PKGS)
	CGO_ENABLED=0 $(GO) vet $(PKGS)

.PHONY: bench
bench: ## Run the benchmarks against every backend, side by side (see docs/BENCHMARKS.md).
	$(SERVICES) --postgres --mariadb --kafka -- env INBOX_REQUIRE_BACKENDS=1 $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m $(PKGS)

.PHONY: chaos
chaos: ## Kill consumers, restart Kafka and the databases, inject duplicates, then handler and configuration faults; prove exactly once on every database (see docs/RELIABILITY.md).
	$(SERVICES) --postgres --mariadb --kafka -- $(GO) run ./cmd/inbox-chaos -session 3s -phases chaos,faults

.PHONY: ci
ci: lint test ## What CI runs.
