module github.com/inboxgo/inbox/cmd/inboxctl

go 1.25.0

require (
	github.com/go-sql-driver/mysql v1.8.1
	github.com/inboxgo/inbox v0.0.0
	github.com/inboxgo/inbox/adapters/mysql v0.0.0
	github.com/inboxgo/inbox/adapters/postgres v0.0.0
	github.com/inboxgo/inbox/adapters/sqlite v0.0.0
	github.com/segmentio/kafka-go v0.4.51
	gorm.io/driver/mysql v1.6.0
	gorm.io/driver/postgres v1.6.3
	gorm.io/driver/sqlite v1.6.0
	gorm.io/gorm v1.31.2
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.10.0 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/jinzhu/inflection v1.0.0 // indirect
	github.com/jinzhu/now v1.1.5 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/mattn/go-sqlite3 v1.14.32 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

replace (
	github.com/inboxgo/inbox => ../..
	github.com/inboxgo/inbox/adapters/mysql => ../../adapters/mysql
	github.com/inboxgo/inbox/adapters/postgres => ../../adapters/postgres
	github.com/inboxgo/inbox/adapters/sqlite => ../../adapters/sqlite
)
