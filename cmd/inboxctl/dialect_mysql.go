package main

import (
	"context"
	"fmt"
	"strings"

	gomysql "github.com/go-sql-driver/mysql"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/storage"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
)

func init() {
	delete(unavailable, dialectMySQL)
	backends[dialectMySQL] = &backend{
		name:         dialectMySQL,
		defaultTable: inboxmysql.DefaultTable,
		checkDSN: func(dsn string) error {
			if _, err := gomysql.ParseDSN(dsn); err != nil {
				return usageErrorf("MySQL DSN: %v (want user:password@tcp(host:3306)/dbname?parseTime=true)", err)
			}
			return nil
		},
		// The DSN exactly as given, with GORM's plain dialector: its
		// parameters (sql_mode, clientFoundRows, ...) are what check tests.
		open: func(dsn string) gorm.Dialector { return gormmysql.Open(dsn) },
		newStore: func(table, schema string) (storage.InboxStore, error) {
			return inboxmysql.New(inboxmysql.Options{Table: table, Schema: schema})
		},
		watermarkSuffix:    inboxmysql.WatermarkSuffix,
		defaultOutboxTable: inboxmysql.DefaultOutboxTable,
		newOutboxStore: func(table, schema string, shards int) (storage.OutboxStore, error) {
			return inboxmysql.NewOutbox(inboxmysql.OutboxOptions{Table: table, Schema: schema, Shards: shards})
		},
		tables: func(ctx context.Context, db *gorm.DB, schema, prefix string) ([]string, error) {
			var names []string
			err := db.WithContext(ctx).Raw(`SELECT TABLE_NAME FROM information_schema.TABLES
				WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME LIKE ? ORDER BY TABLE_NAME`,
				schema, likePrefix(prefix)).Scan(&names).Error
			return keepPrefixed(names, prefix), err
		},
		dropTable: func(ctx context.Context, db *gorm.DB, schema, name string) error {
			return db.WithContext(ctx).Exec(`DROP TABLE IF EXISTS ` + myQualified(schema, name)).Error
		},
		sessionCheck: mysqlSessionCheck,
		size:         mysqlSize,
		features:     conformance.Features{ExpiryCountsRows: false},
	}
}

func myQualified(schema, name string) string {
	if schema == "" {
		return "`" + name + "`"
	}
	return "`" + schema + "`.`" + name + "`"
}

// mysqlSize sums DATA_LENGTH and INDEX_LENGTH over the table's partitions in
// information_schema.PARTITIONS (InnoDB's estimates, refreshed by ANALYZE
// TABLE).
func mysqlSize(ctx context.Context, db *gorm.DB, schema, table string) (*sizeInfo, error) {
	var parts []struct {
		Name  *string
		Bytes int64
		Rows  *int64
	}
	err := db.WithContext(ctx).Raw(`SELECT PARTITION_NAME AS name, COALESCE(DATA_LENGTH, 0) + COALESCE(INDEX_LENGTH, 0) AS bytes, TABLE_ROWS AS `+"`rows`"+`
		FROM information_schema.PARTITIONS
		WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ?
		ORDER BY PARTITION_ORDINAL_POSITION`, schema, table).Scan(&parts).Error
	if err != nil {
		return nil, fmt.Errorf("read information_schema.PARTITIONS: %w", err)
	}
	if len(parts) == 0 {
		return nil, fmt.Errorf("table %s not found in information_schema", table)
	}
	info := &sizeInfo{Scope: "data and indexes (the server's estimate)", Method: "information_schema data_length+index_length"}
	for _, p := range parts {
		info.Bytes += p.Bytes
		if p.Name == nil { // not partitioned
			continue
		}
		rows := int64(-1)
		if p.Rows != nil {
			rows = *p.Rows
		}
		info.Partitions = append(info.Partitions, partitionSize{Name: *p.Name, Bytes: p.Bytes, Rows: rows})
	}
	return info, nil
}

// mysqlSessionCheck reports a default storage engine other than InnoDB: the
// adapter creates its table as InnoDB, but business tables created without
// ENGINE= on such a connection (MyISAM ignores ROLLBACK) keep the effect of a
// delivery whose inbox row was rolled back.
func mysqlSessionCheck(ctx context.Context, db *gorm.DB) error {
	var engine string
	// No bind arguments: GORM would read @@ as a named parameter.
	if err := db.WithContext(ctx).Raw("SELECT @@SESSION.default_storage_engine").Row().Scan(&engine); err != nil {
		return fmt.Errorf("read default_storage_engine: %w", err)
	}
	if !strings.EqualFold(engine, "InnoDB") {
		return fmt.Errorf("default_storage_engine is %s, not InnoDB: tables created without ENGINE=InnoDB (such as business tables whose writes must roll back with the inbox row) ignore ROLLBACK", engine)
	}
	return nil
}
