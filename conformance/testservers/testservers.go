// Package testservers hands tests the addresses of the real backends that the
// project's scripts start (scripts/with-services.sh), and decides what a test
// does when one is missing: outside CI it is skipped with the command that
// would provide it; under CI=true, or INBOX_REQUIRE_BACKENDS=1 (set by
// make test), a missing backend fails the test, so a skipped backend can
// never pass as green.
package testservers

import (
	"os"
	"strings"
	"testing"
)

// Environment variables naming the backends.
const (
	PostgresVar = "INBOX_POSTGRES_DSN"
	MySQLVar    = "INBOX_MYSQL_DSN"
	KafkaVar    = "INBOX_KAFKA_BROKERS"
)

// Required reports whether missing backends must fail tests.
func Required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("INBOX_REQUIRE_BACKENDS") == "1"
}

func lookup(t testing.TB, name, flag string) string {
	t.Helper()
	v := strings.TrimSpace(os.Getenv(name))
	if v != "" {
		return v
	}
	msg := name + " is not set; run the tests with `make test`, or `scripts/with-services.sh " + flag + " -- go test ./...`"
	if Required() {
		t.Fatal("backend missing where every backend is required: " + msg)
	}
	t.Skip(msg)
	return ""
}

// PostgresDSN returns the DSN of the test PostgreSQL server.
func PostgresDSN(t testing.TB) string { t.Helper(); return lookup(t, PostgresVar, "--postgres") }

// MySQLDSN returns the DSN (go-sql-driver/mysql form) of the test MariaDB/MySQL server.
func MySQLDSN(t testing.TB) string { t.Helper(); return lookup(t, MySQLVar, "--mariadb") }

// KafkaBrokers returns the test Kafka brokers' addresses.
func KafkaBrokers(t testing.TB) []string {
	t.Helper()
	return strings.Split(lookup(t, KafkaVar, "--kafka"), ",")
}
