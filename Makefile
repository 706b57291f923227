# The inbox library. `make help` lists the targets.

GO       ?= go
SERVICES := scripts/with-services.sh
# ./... stops at a nested module: every module of go.work is listed, so
# every target covers them all (README, "Modules").
PKGS     := ./... ./adapters/postgres/... ./adapters/mysql/... ./adapters/sqlite/... ./otel/... ./transport/franzgo/... ./cmd/inboxctl/... ./dev/...
# golangci-lint, pinned, built into .bin/ by the lint target (the module proxy serves it).
GOLANGCI_VERSION := v2.15.0
GOLANGCI := .bin/golangci-lint-$(GOLANGCI_VERSION)

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: demo
demo: ## Run the demo: SQLite and an in-process Kafka broker, nothing to install.
	$(GO) run ./dev/cmd/inbox-demo

.PHONY: test
test: ## Run every test against real PostgreSQL, MariaDB, SQLite and Kafka (started and stopped here), the consumer's suite and chaos phases again on franz-go, then every benchmark once at tiny sizes; no backend may be skipped.
	$(SERVICES) --postgres --mariadb --kafka -- env INBOX_REQUIRE_BACKENDS=1 \
		sh -c '$(GO) test -race -count=1 -timeout 45m $(PKGS) && $(FRANZGO_PASS) && $(BENCH_SMOKE) $(GO) test -run "^$$" -bench . -benchtime 1x -timeout 20m $(PKGS)'

# The consumer's real-broker suite (the sequenced end-to-end test among
# them) and the chaos phases that run consumers (TestChaosShort, the pause
# and partition phases) again on franz-go (dev/testtransport); the rest of
# the tests do not depend on the consumer's Kafka client.
FRANZGO_PASS := INBOX_TEST_TRANSPORT=franz-go $(GO) test -race -count=1 -timeout 30m ./dev/tests/consumer/ && \
	INBOX_TEST_TRANSPORT=franz-go $(GO) test -race -count=1 -timeout 20m -run "^(TestChaosShort|TestChaosPause|TestChaosPartition)$$" ./dev/chaos/

# Every benchmark once with the smallest sizes, so one that no longer runs
# (a setup the library now refuses, a changed API) fails `make test`; the
# figures mean nothing at these sizes.
BENCH_SMOKE := INBOX_BENCH_EVENTS=100 INBOX_OUTBOX_EVENTS=1000 INBOX_BENCH_ROUNDS=1 INBOX_BENCH_SIZES=0 INBOX_BENCH_EXPIRY_ROWS=1000 INBOX_BENCH_KAFKA_EVENTS=1000 INBOX_BENCH_WARMUP=1

.PHONY: test-short
test-short: ## Run the tests that need no server (backends are skipped; not for CI).
	$(GO) test -race -count=1 $(PKGS)

.PHONY: lint
lint: $(GOLANGCI) ## gofmt, go vet, golangci-lint (.golangci.yml), everything building without cgo (no SQLite there), and a PostgreSQL-only user module at go 1.25.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GOLANGCI) run $(PKGS)
	CGO_ENABLED=0 $(GO) build $(PKGS)
	CGO_ENABLED=0 $(GO) vet $(PKGS)
	scripts/check-modules.sh

$(GOLANGCI):
	@mkdir -p .bin
	GOBIN=$(CURDIR)/.bin $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_VERSION)
	mv .bin/golangci-lint $@

.PHONY: bench
bench: ## Run the benchmarks against every backend, side by side (see docs/BENCHMARKS.md).
	$(SERVICES) --postgres --mariadb --kafka -- env INBOX_REQUIRE_BACKENDS=1 $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m $(PKGS)

.PHONY: chaos
chaos: ## Kill consumers, restart Kafka and the databases, inject duplicates, then handler and configuration faults, the outbox chain under kills and restarts, a message its aligned outbox loses, relays and consumers paused (SIGSTOP), database links frozen, the chain's producer database restored from a backup under load, then failed over to an asynchronous standby (PostgreSQL); prove exactly once, and the loss stopped loudly, on every database (see docs/RELIABILITY.md).
	$(SERVICES) --postgres --mariadb --kafka -- $(GO) run ./dev/cmd/inbox-chaos -session 3s -timeout 60m -phases chaos,faults,chain,gap,pause,partition,rewind
	$(SERVICES) --postgres-standby async --kafka -- $(GO) run ./dev/cmd/inbox-chaos -db postgres -session 3s -timeout 20m -phases rewind -rewind-failover

# The failover runs (docs/RELIABILITY.md, "Failover"). Each starts its own servers.
FAILOVER_RUN := $(GO) run ./dev/cmd/inbox-chaos -db postgres -orders 6000 -waves 12 -duration 100s -kills 10 -broker-restarts 0 -terminations 2 -storms 0 -failovers 5 -session 3s

MARIADB_FAILOVER_RUN := $(GO) run ./dev/cmd/inbox-chaos -db mysql -orders 6000 -waves 12 -duration 60s -kills 5 -broker-restarts 0 -terminations 1 -storms 0 -failovers 1 -session 3s

.PHONY: chaos-failover
chaos-failover: ## Database primary killed, standby promoted under load: PostgreSQL 5x per mode (sync, async), MariaDB 1x (semisync, async); with StoreOffsets 0 lost, 0 twice; async without it measures the losses.
	$(SERVICES) --postgres-standby sync --kafka -- $(FAILOVER_RUN) -store-offsets
	$(SERVICES) --postgres-standby async --kafka -- $(FAILOVER_RUN) -store-offsets
	$(SERVICES) --postgres-standby async --kafka -- $(FAILOVER_RUN) -allow-loss
	$(SERVICES) --mariadb-replica semisync --kafka -- $(MARIADB_FAILOVER_RUN) -store-offsets
	$(SERVICES) --mariadb-replica async --kafka -- $(MARIADB_FAILOVER_RUN) -store-offsets
	$(SERVICES) --mariadb-replica async --kafka -- $(MARIADB_FAILOVER_RUN) -allow-loss

.PHONY: chaos-cluster
chaos-cluster: ## Three-node Kafka cluster: 12 SIGKILLs of the group coordinator's and busy partitions' leaders under load (0 lost, 0 twice, no dead letter).
	$(SERVICES) --postgres --kafka-cluster -- $(GO) run ./dev/cmd/inbox-chaos -db postgres -orders 6000 -waves 12 -duration 240s -kills 10 -leader-kills 12 -terminations 0 -storms 0 -db-restarts 0 -session 6s

.PHONY: ci
ci: lint test ## What CI runs.
