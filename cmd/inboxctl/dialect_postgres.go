package main

import (
	"context"
	"fmt"

	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/storage"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
)

func init() {
	delete(unavailable, dialectPostgres)
	backends[dialectPostgres] = &backend{
		name:          dialectPostgres,
		defaultTable:  inboxpg.DefaultTable,
		defaultSchema: inboxpg.DefaultSchema,
		open:          func(dsn string) gorm.Dialector { return gormpg.Open(dsn) },
		newStore: func(table, schema string) (storage.InboxStore, error) {
			return inboxpg.New(inboxpg.Options{Schema: schema, Table: table})
		},
		watermarkSuffix:    inboxpg.WatermarkSuffix,
		defaultOutboxTable: inboxpg.DefaultOutboxTable,
		newOutboxStore: func(table, schema string, shards int) (storage.OutboxStore, error) {
			return inboxpg.NewOutbox(inboxpg.OutboxOptions{Schema: schema, Table: table, Shards: shards})
		},
		tables: func(ctx context.Context, db *gorm.DB, schema, prefix string) ([]string, error) {
			var names []string
			err := db.WithContext(ctx).Raw(`SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
				WHERE n.nspname = COALESCE(NULLIF(?, ''), current_schema()) AND c.relkind IN ('r', 'p') AND c.relname LIKE ? ESCAPE '\'
				ORDER BY c.relname`, schema, likePrefix(prefix)).Scan(&names).Error
			return keepPrefixed(names, prefix), err
		},
		dropTable: func(ctx context.Context, db *gorm.DB, schema, name string) error {
			return db.WithContext(ctx).Exec(`DROP TABLE IF EXISTS ` + pgQualified(schema, name) + ` CASCADE`).Error
		},
		schemaExists: func(ctx context.Context, db *gorm.DB, schema string) (bool, error) {
			var ok bool
			err := db.WithContext(ctx).Raw(`SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = ?)`, schema).Scan(&ok).Error
			return ok, err
		},
		dropEmptySchema: func(ctx context.Context, db *gorm.DB, schema string) error {
			// RESTRICT: only if nothing is in it.
			return db.WithContext(ctx).Exec(`DROP SCHEMA IF EXISTS "` + schema + `" RESTRICT`).Error
		},
		size:     postgresSize,
		features: conformance.Features{ExpiryCountsRows: false},
	}
}

func pgQualified(schema, name string) string {
	if schema == "" {
		return `"` + name + `"`
	}
	return `"` + schema + `"."` + name + `"`
}

// postgresSize sums pg_total_relation_size (heap, TOAST and indexes) over the
// leaf partitions of the inbox table, or of the table itself if it is not
// partitioned.
func postgresSize(ctx context.Context, db *gorm.DB, schema, table string) (*sizeInfo, error) {
	if schema == "" {
		schema = inboxpg.DefaultSchema
	}
	var parts []struct {
		Name  string
		Bytes int64
		Rows  int64
	}
	err := db.WithContext(ctx).Raw(`SELECT c.relname AS name, pg_total_relation_size(t.relid) AS bytes, c.reltuples::bigint AS rows
		FROM pg_partition_tree(?::regclass) t JOIN pg_class c ON c.oid = t.relid
		WHERE t.isleaf ORDER BY c.relname`, pgQualified(schema, table)).Scan(&parts).Error
	if err != nil {
		return nil, fmt.Errorf("read partition sizes: %w", err)
	}
	info := &sizeInfo{Scope: "table, partitions, TOAST and indexes", Method: "pg_total_relation_size"}
	for _, p := range parts {
		info.Bytes += p.Bytes
		rows := p.Rows
		if rows < 0 { // never vacuumed or analysed
			rows = -1
		}
		if p.Name != table {
			info.Partitions = append(info.Partitions, partitionSize{Name: p.Name, Bytes: p.Bytes, Rows: rows})
		}
	}
	return info, nil
}
