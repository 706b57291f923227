// The project's own tests, benchmarks, chaos runs and demo: everything that
// needs every driver or the in-process broker (kfake, which needs go 1.26).
// No library module requires it, so no user downloads it.
module github.com/inboxgo/inbox/dev

go 1.26.0

require (
	github.com/go-sql-driver/mysql v1.8.1
	github.com/inboxgo/inbox v0.0.0
	github.com/inboxgo/inbox/adapters/mysql v0.0.0
	github.com/inboxgo/inbox/adapters/postgres v0.0.0
	github.com/inboxgo/inbox/adapters/sqlite v0.0.0
	github.com/inboxgo/inbox/otel v0.0.0
	github.com/inboxgo/inbox/transport/franzgo v0.0.0
	github.com/jackc/pgx/v5 v5.10.0
	github.com/segmentio/kafka-go v0.4.51
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	github.com/twmb/franz-go/pkg/kmsg v1.15.1
	go.opentelemetry.io/otel v1.46.0
	go.opentelemetry.io/otel/sdk v1.46.0
	go.opentelemetry.io/otel/sdk/metric v1.46.0
	go.opentelemetry.io/otel/trace v1.46.0
	gonum.org/v1/plot v0.17.0
	gorm.io/driver/mysql v1.6.0
	gorm.io/driver/postgres v1.6.3
	gorm.io/driver/sqlite v1.6.0
	gorm.io/gorm v1.31.2
)

require (
	codeberg.org/go-fonts/liberation v0.5.0 // indirect
	codeberg.org/go-latex/latex v0.2.0 // indirect
	codeberg.org/go-pdf/fpdf v0.11.1 // indirect
	filippo.io/edwards25519 v1.2.0 // indirect
	git.sr.ht/~sbinet/gg v0.7.0 // indirect
	github.com/ajstarks/svgo v0.0.0-20211024235047-1546f124cd8b // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/golang/freetype v0.0.0-20170609003504-e2365dfdc4a0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/jinzhu/inflection v1.0.0 // indirect
	github.com/jinzhu/now v1.1.5 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/mattn/go-sqlite3 v1.14.32 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel/metric v1.46.0 // indirect
	golang.org/x/crypto v0.54.0 // indirect
	golang.org/x/image v0.30.0 // indirect
	golang.org/x/net v0.56.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

replace (
	github.com/inboxgo/inbox => ..
	github.com/inboxgo/inbox/adapters/mysql => ../adapters/mysql
	github.com/inboxgo/inbox/adapters/postgres => ../adapters/postgres
	github.com/inboxgo/inbox/adapters/sqlite => ../adapters/sqlite
	github.com/inboxgo/inbox/otel => ../otel
	github.com/inboxgo/inbox/transport/franzgo => ../transport/franzgo
)
