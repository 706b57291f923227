#!/usr/bin/env bash
# Proves what a user of one adapter gets (README, "Modules"): a fresh module
# that imports only the PostgreSQL adapter and the consumer says go 1.25,
# builds with CGO_ENABLED=0, and its go.mod names no SQLite driver, no MySQL
# driver and no in-process broker. Also checks that every library module
# declares go 1.25. Needs the Go module proxy (or a warm module cache).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fail() { echo "check-modules: $*" >&2; exit 1; }

for mod in go.mod adapters/postgres/go.mod adapters/mysql/go.mod adapters/sqlite/go.mod otel/go.mod transport/franzgo/go.mod cmd/inboxctl/go.mod; do
	line="$(grep -m1 '^go ' "$root/$mod")"
	[ "$line" = "go 1.25.0" ] || fail "$mod says '$line', want 'go 1.25.0' (the oldest supported Go)"
done

# What each library module's packages and their tests import: a user's
# go mod tidy downloads the test imports of every package it builds.
forbid() { # module dir, pattern of module paths it must not reach
	local mods found
	mods="$(cd "$root/$1" && GOWORK=off go list -deps -test -f '{{with .Module}}{{.Path}}{{end}}' ./... 2>&1)" ||
		fail "$1: its packages and tests do not load on their own (an import its go.mod does not require?): $(echo "$mods" | tail -3)"
	found="$(echo "$mods" | sort -u | grep -E "$2" || true)"
	[ -z "$found" ] || fail "$1 (or its tests) imports $(echo "$found" | tr '\n' ' ')"
}
# The root module's own tests run on SQLite (internal/sqlitetest, imported by
# test files only): its tests may reach the SQLite driver, its packages not.
# A user's go mod tidy then fetches gorm.io/driver/sqlite and go-sqlite3 for
# their go.sum lines, but builds neither and its go.mod names neither (the
# check at the end).
forbid . 'go-sql-driver|jackc/pgx|franz-go|gorm.io/driver/(mysql|postgres)'
pkgs="$(cd "$root" && GOWORK=off go list ./... | grep -v '/internal/sqlitetest$')"
found="$(cd "$root" && GOWORK=off go list -deps -f '{{with .Module}}{{.Path}}{{end}}' $pkgs | sort -u | grep -E 'mattn/go-sqlite3|gorm.io/driver' || true)"
[ -z "$found" ] || fail "the root module's packages (not only their tests) import $(echo "$found" | tr '\n' ' ')"
found="$(cd "$root" && GOWORK=off go list -f '{{.ImportPath}}: {{join .Imports " "}}' ./... | grep 'internal/sqlitetest' | grep -v '^github.com/inboxgo/inbox/internal/sqlitetest:' || true)"
[ -z "$found" ] || fail "internal/sqlitetest is imported outside test files: $found"
forbid otel 'mattn/go-sqlite3|go-sql-driver|jackc/pgx|franz-go|gorm.io/driver'
forbid adapters/postgres 'mattn/go-sqlite3|go-sql-driver|franz-go|driver/sqlite|driver/mysql'
forbid adapters/mysql 'mattn/go-sqlite3|jackc/pgx|franz-go|driver/sqlite|driver/postgres'
forbid adapters/sqlite 'go-sql-driver|jackc/pgx|franz-go|driver/mysql|driver/postgres'
# The franz-go transport brings franz-go and nothing of the databases or
# the in-process broker.
forbid transport/franzgo 'mattn/go-sqlite3|go-sql-driver|jackc/pgx|gorm.io/driver|kfake'

dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cat > "$dir/go.mod" <<MOD
module example.com/orders

go 1.25

require (
	github.com/inboxgo/inbox v0.0.0
	github.com/inboxgo/inbox/adapters/postgres v0.0.0
)

replace (
	github.com/inboxgo/inbox => $root
	github.com/inboxgo/inbox/adapters/postgres => $root/adapters/postgres
)
MOD
cat > "$dir/main.go" <<'GO'
package main

import (
	"context"
	"log"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/inbox"
)

func main() {
	db, err := gorm.Open(postgres.Open("host=127.0.0.1 dbname=orders"), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	store, err := inboxpg.New(inboxpg.Options{})
	if err != nil {
		log.Fatal(err)
	}
	ib, err := inbox.New(db, store, inbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{
		Brokers: []string{"127.0.0.1:9092"}, GroupID: "inventory", Topics: []string{"orders"},
		Inbox: ib, Consumer: "reserve-stock",
		Handler: func(ctx context.Context, tx *gorm.DB, m consumer.Message) error { return nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(c.Run(context.Background()))
}
GO
cd "$dir"
GOWORK=off GOFLAGS=-mod=mod go get gorm.io/driver/postgres@v1.6.3 >/dev/null 2>&1 || true
GOWORK=off GOFLAGS=-mod=mod go mod tidy
GOWORK=off CGO_ENABLED=0 go build -o /dev/null . || fail "the PostgreSQL-only module does not build without cgo"
grep -q '^go 1.25' go.mod || fail "go.mod of the user's module was raised to $(grep '^go ' go.mod)"
if grep -nE 'sqlite|go-sql-driver|gorm.io/driver/mysql|kfake|franz-go' go.mod; then
	fail "the PostgreSQL-only module's go.mod names the modules above"
fi
echo "check-modules: a PostgreSQL + consumer module says go 1.25, builds without cgo, and its go.mod is:"
sed -n '1,/^replace/p' go.mod | sed '/^replace/d'
