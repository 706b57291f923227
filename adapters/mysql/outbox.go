package mysql

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/inboxgo/inbox/storage"
	"gorm.io/gorm"
)

// Defaults for OutboxOptions.
const (
	DefaultOutboxTable = "outbox_messages"
	DefaultShards      = 64
)

// OutboxOptions configures an OutboxStore.
type OutboxOptions struct {
	// Table is the partitioned outbox table; <Table>_shards numbers each
	// shard's rows, <Table>_relay holds each shard's published mark and
	// relay lease, and <Table>_source the table's source id and epoch.
	// Default DefaultOutboxTable.
	Table string
	// Schema is the database holding the tables; empty means the
	// connection's current database.
	Schema string
	// Shards is the number of shards, fixed when the tables are made.
	// Default DefaultShards.
	Shards int
	// DeleteBatch is how many published rows of expired days one DELETE
	// removes from a partition that Maintain keeps. Default 5000.
	DeleteBatch int
	// LockWait, DDLLockWait and InitialDays are as in Options.
	LockWait    time.Duration
	DDLLockWait time.Duration
	InitialDays int
}

// OutboxStore is the MySQL/MariaDB outbox Store (MariaDB 10.6+, MySQL 8:
// it needs SKIP LOCKED).
//
// Append locks the shards' counter rows in <table>_shards in ascending
// order with SELECT ... FOR UPDATE and moves them on; the row locks order
// the enqueuing transactions of a shard until they end. Relays lease shards
// in <table>_relay with SELECT ... FOR UPDATE SKIP LOCKED and an expiry by
// the server's UTC clock, and acknowledge with one UPDATE per cycle.
//
// The outbox table is partitioned by RANGE COLUMNS(day), the day a row was
// enqueued, like the inbox table. Maintain drops a past day's partition only
// when none of its rows lies beyond its shard's published mark (one index
// probe per shard); otherwise the day is reported in Held. MySQL cannot
// check and drop in one step: the guarantee rests on enqueuers' clocks being
// within the retention window of the truth, so that no row is ever added to
// an expired day.
//
// The table's source id and epoch (storage.Sequenced) are the one row of
// <table>_source, made by Migrate under its maintenance lock.
type OutboxStore struct {
	tbl     *Store // the outbox table's names, lock and partition helpers
	shards  int
	qualify func(name string) string
}

// NewOutbox validates opts and returns an OutboxStore. It does not touch
// the database.
func NewOutbox(opts OutboxOptions) (*OutboxStore, error) {
	opts.Table = cmp.Or(opts.Table, DefaultOutboxTable)
	if opts.Shards < 0 || opts.Shards > 1<<16 {
		return nil, fmt.Errorf("%w: %d shards, want 1..65536", storage.ErrInvalidConfig, opts.Shards)
	}
	if opts.DeleteBatch < 0 {
		return nil, fmt.Errorf("%w: negative delete batch %d", storage.ErrInvalidConfig, opts.DeleteBatch)
	}
	if err := storage.ValidateIdentifier("table name", opts.Table+"_shards"); err != nil {
		return nil, err
	}
	tbl, err := New(Options{Table: opts.Table, Schema: opts.Schema, LockWait: opts.LockWait,
		DDLLockWait: opts.DDLLockWait, InitialDays: opts.InitialDays})
	if err != nil {
		return nil, err
	}
	tbl.deleteBatch = cmp.Or(opts.DeleteBatch, 5000)
	qualify := func(name string) string {
		if opts.Schema != "" {
			return "`" + opts.Schema + "`.`" + name + "`"
		}
		return "`" + name + "`"
	}
	return &OutboxStore{tbl: tbl, shards: cmp.Or(opts.Shards, DefaultShards), qualify: qualify}, nil
}

// Table returns the outbox table name (unqualified).
func (s *OutboxStore) Table() string { return s.tbl.name }

func (s *OutboxStore) shardsTable() string { return s.qualify(s.tbl.name + "_shards") }
func (s *OutboxStore) relayTable() string  { return s.qualify(s.tbl.name + "_relay") }
func (s *OutboxStore) sourceTable() string { return s.qualify(s.tbl.name + "_source") }

// sourceRow inserts the source row, with the source id value (a bound
// parameter or an SQL expression), unless there is one.
func (s *OutboxStore) sourceRow(value string) string {
	return `INSERT INTO ` + s.sourceTable() + ` (id, source) VALUES (1, ` + value + `) ON DUPLICATE KEY UPDATE id = id`
}

// leaseNever is a lease_until long past.
const leaseNever = "'1970-01-02 00:00:00'"

// MigrationSQL returns Migrate's statements with partitions from the day
// before plan.Today through plan.PrepareThrough (at least
// OutboxOptions.InitialDays ahead, as Migrate makes them) and the catch-all.
// The source id is made by the server when the statements run (an MD5 of
// RAND() and the clock: 32 hex digits; not UUID(), which statement-based
// replication does not carry to a replica).
func (s *OutboxStore) MigrationSQL(plan storage.MaintenancePlan) ([]string, error) {
	today := storage.DayOf(plan.Today)
	if plan.PrepareThrough.Before(today) {
		return nil, fmt.Errorf("%w: plan prepares through %s, before %s", storage.ErrInvalidConfig, dayText(plan.PrepareThrough), dayText(today))
	}
	return append(s.createStatements(today, storage.DayOf(plan.PrepareThrough)), s.sourceRow(`MD5(CONCAT(RAND(), NOW(6)))`)), nil
}

// createStatements makes the tables, the outbox table with a partition for
// each day from the day before today through last (at least
// Options.InitialDays ahead) and the catch-all, and the shards.
func (s *OutboxStore) createStatements(today, last time.Time) []string {
	last = maxTime(last, today.AddDate(0, 0, s.tbl.initialDays))
	var b strings.Builder
	b.WriteString(`CREATE TABLE IF NOT EXISTS ` + s.tbl.table + ` (
		shard      INT             NOT NULL,
		seq        BIGINT          NOT NULL,
		day        DATE            NOT NULL,
		event_id   VARBINARY(255)  NOT NULL,
		topic      VARBINARY(249)  NOT NULL,
		msg_key    LONGBLOB        NULL,
		msg_value  LONGBLOB        NOT NULL,
		headers    LONGBLOB        NOT NULL,
		created_at DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
		PRIMARY KEY (shard, seq, day)
	) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
	PARTITION BY RANGE COLUMNS(day) (`)
	for d := today.AddDate(0, 0, -1); !d.After(last); d = d.AddDate(0, 0, 1) {
		fmt.Fprintf(&b, "PARTITION %s VALUES LESS THAN ('%s'), ", partitionName(d), dayText(d.AddDate(0, 0, 1)))
	}
	b.WriteString("PARTITION pmax VALUES LESS THAN (MAXVALUE))")
	values := make([]string, s.shards)
	for i := range values {
		values[i] = "(" + strconv.Itoa(i) + ")"
	}
	return []string{
		b.String(),
		// next_seq is the last number handed out in the shard.
		`CREATE TABLE IF NOT EXISTS ` + s.shardsTable() + ` (
			shard    INT    NOT NULL PRIMARY KEY,
			next_seq BIGINT NOT NULL DEFAULT 0
		) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + s.relayTable() + ` (
			shard             INT            NOT NULL PRIMARY KEY,
			published_through BIGINT         NOT NULL DEFAULT 0,
			owner             VARBINARY(128) NOT NULL DEFAULT '',
			lease_until       DATETIME(6)    NOT NULL DEFAULT ` + leaseNever + `
		) ENGINE=InnoDB`,
		// Where the relay starts reading the shard's partition, and the epoch
		// of the row at the mark (storage.Mark.Offset, Epoch);
		// added to relay tables made before it.
		`ALTER TABLE ` + s.relayTable() + ` ADD COLUMN IF NOT EXISTS published_offset BIGINT NOT NULL DEFAULT 0, ADD COLUMN IF NOT EXISTS published_epoch BIGINT NOT NULL DEFAULT 0`,
		// One row: the table's source id (made once, by Migrate) and epoch
		// (raised by BumpEpoch), for the relay's sequence headers.
		`CREATE TABLE IF NOT EXISTS ` + s.sourceTable() + ` (
			id         TINYINT       NOT NULL PRIMARY KEY CHECK (id = 1),
			source     VARBINARY(64) NOT NULL,
			epoch      BIGINT        NOT NULL DEFAULT 1 CHECK (epoch >= 1),
			created_at DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
			epoch_at   DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
		) ENGINE=InnoDB`,
		`INSERT INTO ` + s.shardsTable() + ` (shard) VALUES ` + strings.Join(values, ",") + ` ON DUPLICATE KEY UPDATE shard = shard`,
		`INSERT INTO ` + s.relayTable() + ` (shard) VALUES ` + strings.Join(values, ",") + ` ON DUPLICATE KEY UPDATE shard = shard`,
	}
}

// Migrate creates the tables (the outbox table with partitions from
// yesterday through Options.InitialDays ahead, and a catch-all), the shards
// and the source row (a new source id, epoch 1) under the table's
// maintenance lock, and checks the engine, the partitioning and the number
// of shards. The lock serialises concurrent calls: the first makes the
// source id, the others keep it.
func (s *OutboxStore) Migrate(ctx context.Context, db *gorm.DB) error {
	return s.tbl.withLock(ctx, db, func(conn *gorm.DB) error {
		today := storage.DayOf(time.Now())
		for _, q := range s.createStatements(today, today) {
			if err := conn.Exec(q).Error; err != nil {
				return fmt.Errorf("mysql: migrate %s: %w", s.tbl.name, err)
			}
		}
		if err := conn.Exec(s.sourceRow("?"), []byte(storage.NewSourceID())).Error; err != nil {
			return fmt.Errorf("mysql: make the source of %s: %w", s.tbl.name, err)
		}
		if _, err := s.tbl.readPartitions(conn); err != nil {
			return err
		}
		if err := s.tbl.checkEngine(conn); err != nil {
			return err
		}
		var have struct{ Shards, Relay, Top int64 }
		if err := conn.Raw(`SELECT (SELECT COUNT(*) FROM ` + s.shardsTable() + `) AS shards, (SELECT COUNT(*) FROM ` + s.relayTable() + `) AS relay,
			(SELECT COALESCE(MAX(shard), -1) FROM ` + s.shardsTable() + `) AS top`).Scan(&have).Error; err != nil {
			return fmt.Errorf("mysql: count shards of %s: %w", s.tbl.name, err)
		}
		if have.Shards != int64(s.shards) || have.Relay != int64(s.shards) || have.Top != int64(s.shards-1) {
			return fmt.Errorf("%w: outbox table %s has %d shards (%d relay rows), the store is configured with %d; changing it would move keys to other shards and break their order",
				storage.ErrInvalidConfig, s.tbl.name, have.Shards, have.Relay, s.shards)
		}
		return nil
	})
}

func intList[T int32 | int64](vs []T) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = strconv.FormatInt(int64(v), 10)
	}
	return strings.Join(parts, ",")
}

// Append locks the counter rows of the rows' shards in ascending order,
// moves them on, and inserts the rows.
func (s *OutboxStore) Append(ctx context.Context, tx *gorm.DB, rows []storage.OutboxRow) error {
	tx = tx.WithContext(ctx)
	counts := storage.AssignShards(rows, s.shards)
	shards := make([]int32, len(counts))
	var bump strings.Builder
	for i, c := range counts {
		shards[i] = c.Shard
		fmt.Fprintf(&bump, " WHEN %d THEN %d", c.Shard, c.Rows)
	}
	var current []struct {
		Shard   int32
		NextSeq int64
	}
	// FORCE INDEX: on a table of few shards InnoDB's optimizer scans the
	// whole index for an IN list of most of them, locking every row it
	// passes, the other transactions' shards too and out of order: a
	// deadlock. The primary key's ranges lock only the rows listed, in
	// ascending order.
	if err := tx.Raw(`SELECT shard, next_seq FROM ` + s.shardsTable() + ` FORCE INDEX (PRIMARY) WHERE shard IN (` + intList(shards) + `) ORDER BY shard FOR UPDATE`).Scan(&current).Error; err != nil {
		return fmt.Errorf("mysql: lock shards of %s: %w", s.tbl.name, err)
	}
	if len(current) != len(shards) {
		return fmt.Errorf("mysql: %s has %d of the shards %v; run Migrate", s.shardsTable(), len(current), shards)
	}
	first := make(map[int32]int64, len(current))
	for _, c := range current {
		first[c.Shard] = c.NextSeq + 1
	}
	if err := tx.Exec(`UPDATE ` + s.shardsTable() + ` FORCE INDEX (PRIMARY) SET next_seq = next_seq + CASE shard` + bump.String() + ` END WHERE shard IN (` + intList(shards) + `)`).Error; err != nil {
		return fmt.Errorf("mysql: number rows of %s: %w", s.tbl.name, err)
	}
	storage.NumberRows(rows, first)
	const perRow = 8
	for lo := 0; lo < len(rows); lo += 500 {
		hi := min(lo+500, len(rows))
		var b strings.Builder
		b.WriteString(`INSERT INTO ` + s.tbl.table + ` (shard, seq, day, event_id, topic, msg_key, msg_value, headers) VALUES `)
		args := make([]any, 0, perRow*(hi-lo))
		for i, r := range rows[lo:hi] {
			if i > 0 {
				b.WriteString(", ")
			}
			// The first value is never a []byte: GORM would expand it.
			b.WriteString("(?, ?, ?, ?, ?, ?, ?, ?)")
			args = append(args, r.Shard, r.Seq, dayText(r.Day), r.EventID, r.Topic, r.Key, r.Value, r.Headers)
		}
		if err := tx.Exec(b.String(), args...).Error; err != nil {
			return fmt.Errorf("mysql: insert into %s: %w", s.tbl.name, err)
		}
	}
	return nil
}

type pendingShard struct {
	Shard            int32
	PublishedThrough int64
	NextSeq          int64
	// SrcSource and SrcEpoch are the source row, when the claim reads it.
	SrcSource []byte
	SrcEpoch  *int64
}

// Claim finds the shards with unpublished rows (a consistent read that
// locks nothing: enqueuers' counter rows are never waited for), leases those
// no other relay holds with SELECT ... FOR UPDATE SKIP LOCKED and an UPDATE
// in one short transaction, then reads each leased shard's share of
// MaxRows.
func (s *OutboxStore) Claim(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, error) {
	rows, _, _, err := s.claim(ctx, db, req, false)
	return rows, err
}

// ClaimSource claims as Claim does and reads the source row in the
// lease's first statement, the one that finds the pending shards
// (storage.SourceClaimer): one round trip less than Claim and Source apart.
func (s *OutboxStore) ClaimSource(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, string, int64, error) {
	return s.claim(ctx, db, req, true)
}

func (s *OutboxStore) claim(ctx context.Context, db *gorm.DB, req storage.ClaimRequest, withSource bool) ([]storage.OutboxRow, string, int64, error) {
	db = db.WithContext(ctx)
	maxShards := req.MaxShards
	if maxShards <= 0 {
		maxShards = s.shards
	}
	sourceCols, sourceJoin := "", ""
	if withSource {
		sourceCols = ", src.source AS src_source, src.epoch AS src_epoch"
		sourceJoin = " LEFT JOIN " + s.sourceTable() + " src ON src.id = 1"
	}
	var leased []pendingShard
	var source string
	var epoch int64
	err := db.Transaction(func(tx *gorm.DB) error {
		var pending []pendingShard
		if err := tx.Raw(`SELECT r.shard, c.next_seq`+sourceCols+` FROM `+s.relayTable()+` r JOIN `+s.shardsTable()+` c ON c.shard = r.shard`+sourceJoin+`
			WHERE c.next_seq > r.published_through AND (r.owner = ? OR r.lease_until < UTC_TIMESTAMP(6)) ORDER BY r.shard LIMIT ?`,
			[]byte(req.Relay), maxShards).Scan(&pending).Error; err != nil {
			return fmt.Errorf("mysql: find pending shards of %s: %w", s.tbl.name, err)
		}
		if len(pending) == 0 {
			return nil
		}
		if withSource {
			if pending[0].SrcSource == nil || pending[0].SrcEpoch == nil {
				return fmt.Errorf("mysql: %s has no source row; run Migrate", s.sourceTable())
			}
			source, epoch = string(pending[0].SrcSource), *pending[0].SrcEpoch
		}
		ids := make([]int32, len(pending))
		nextSeq := map[int32]int64{}
		for i, p := range pending {
			ids[i], nextSeq[p.Shard] = p.Shard, p.NextSeq
		}
		if err := tx.Raw(`SELECT shard, published_through FROM `+s.relayTable()+` WHERE shard IN (`+intList(ids)+`)
			AND (owner = ? OR lease_until < UTC_TIMESTAMP(6)) ORDER BY shard FOR UPDATE SKIP LOCKED`, []byte(req.Relay)).Scan(&leased).Error; err != nil {
			return fmt.Errorf("mysql: lease shards of %s: %w", s.tbl.name, err)
		}
		if len(leased) == 0 {
			return nil
		}
		ids = ids[:0]
		for i := range leased {
			leased[i].NextSeq = nextSeq[leased[i].Shard]
			ids = append(ids, leased[i].Shard)
		}
		if err := tx.Exec(`UPDATE `+s.relayTable()+` SET owner = ?, lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE shard IN (`+intList(ids)+`)`,
			[]byte(req.Relay), req.Lease.Microseconds()).Error; err != nil {
			return fmt.Errorf("mysql: lease shards of %s: %w", s.tbl.name, err)
		}
		return nil
	}, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil || len(leased) == 0 {
		return nil, "", 0, err
	}
	pending := make([]storage.ShardCount, len(leased))
	through := make(map[int32]int64, len(leased))
	for i, l := range leased {
		pending[i] = storage.ShardCount{Shard: l.Shard, Rows: l.NextSeq - l.PublishedThrough}
		through[l.Shard] = l.PublishedThrough
	}
	var union strings.Builder
	for _, sh := range storage.ShareRows(pending, req.MaxRows) {
		if union.Len() > 0 {
			union.WriteString(" UNION ALL ")
		}
		fmt.Fprintf(&union, "(SELECT shard, seq, CAST(day AS CHAR) AS day, event_id, topic, msg_key, msg_value, headers FROM %s WHERE shard = %d AND seq > %d ORDER BY seq LIMIT %d)",
			s.tbl.table, sh.Shard, through[sh.Shard], sh.Rows)
	}
	if union.Len() == 0 {
		return nil, "", 0, nil
	}
	var stored []struct {
		Shard    int32
		Seq      int64
		Day      string
		EventID  []byte
		Topic    []byte
		MsgKey   []byte
		MsgValue []byte
		Headers  []byte
	}
	if err := db.Raw(union.String()).Scan(&stored).Error; err != nil {
		return nil, "", 0, fmt.Errorf("mysql: read leased shards of %s: %w", s.tbl.name, err)
	}
	rows := make([]storage.OutboxRow, len(stored))
	for i, p := range stored {
		day, err := time.Parse(time.DateOnly, p.Day)
		if err != nil {
			return nil, "", 0, fmt.Errorf("mysql: %s holds a malformed day %q: %w", s.tbl.name, p.Day, err)
		}
		value := p.MsgValue
		if value == nil {
			value = []byte{}
		}
		rows[i] = storage.OutboxRow{Shard: p.Shard, Seq: p.Seq, Day: day, EventID: string(p.EventID), Topic: string(p.Topic), Key: p.MsgKey, Value: value, Headers: p.Headers}
	}
	slices.SortFunc(rows, func(a, b storage.OutboxRow) int {
		return cmp.Or(cmp.Compare(a.Shard, b.Shard), cmp.Compare(a.Seq, b.Seq))
	})
	return rows, source, epoch, nil
}

// Ack locks the marked shards relay still holds and moves their marks, in
// one short transaction.
func (s *OutboxStore) Ack(ctx context.Context, db *gorm.DB, relay string, marks []storage.Mark) error {
	if len(marks) == 0 {
		return nil
	}
	ids := make([]int32, len(marks))
	var set, offsets, epochs strings.Builder
	for i, m := range marks {
		ids[i] = m.Shard
		fmt.Fprintf(&set, " WHEN %d THEN %d", m.Shard, m.Seq)
		fmt.Fprintf(&offsets, " WHEN %d THEN %d", m.Shard, m.Offset)
		fmt.Fprintf(&epochs, " WHEN %d THEN %d", m.Shard, m.Epoch)
	}
	var held []int32
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Raw(`SELECT shard FROM `+s.relayTable()+` WHERE shard IN (`+intList(ids)+`) AND owner = ? ORDER BY shard FOR UPDATE`, []byte(relay)).Scan(&held).Error; err != nil {
			return fmt.Errorf("mysql: lock shards of %s: %w", s.tbl.name, err)
		}
		// A mark naming its event moves only over that event's row: a
		// database that went back under the relay holds another one there,
		// or none.
		var check []string
		var args []any
		for _, m := range marks {
			if m.EventID != "" && slices.Contains(held, m.Shard) {
				check = append(check, "(?, ?, ?)")
				args = append(args, m.Shard, m.Seq, []byte(m.EventID))
			}
		}
		if len(check) > 0 {
			var found []int32
			if err := tx.Raw(`SELECT shard FROM `+s.tbl.table+` WHERE (shard, seq, event_id) IN (`+strings.Join(check, ", ")+`)`, args...).Scan(&found).Error; err != nil {
				return fmt.Errorf("mysql: read the acknowledged rows of %s: %w", s.tbl.name, err)
			}
			held = slices.DeleteFunc(held, func(shard int32) bool {
				for _, m := range marks {
					if m.Shard == shard && m.EventID != "" {
						return !slices.Contains(found, shard)
					}
				}
				return false
			})
		}
		if len(held) == 0 {
			return nil
		}
		// MariaDB assigns left to right: the offset is set first, while
		// published_through is still the old mark.
		if err := tx.Exec(`UPDATE ` + s.relayTable() + ` SET
			published_offset = IF((CASE shard` + set.String() + ` END) > published_through, CASE shard` + offsets.String() + ` END, published_offset),
			published_epoch = IF((CASE shard` + set.String() + ` END) > published_through, CASE shard` + epochs.String() + ` END, published_epoch),
			published_through = GREATEST(published_through, CASE shard` + set.String() + ` END)
			WHERE shard IN (` + intList(held) + `)`).Error; err != nil {
			return fmt.Errorf("mysql: mark shards of %s published: %w", s.tbl.name, err)
		}
		return nil
	}, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	if len(held) < len(marks) {
		var lost []int32
		for _, id := range ids {
			if !slices.Contains(held, id) {
				lost = append(lost, id)
			}
		}
		return fmt.Errorf("%w: shards %v of %s", storage.ErrLeaseLost, lost, s.tbl.name)
	}
	return nil
}

// Marks reads the shards' marks and stored offsets.
func (s *OutboxStore) Marks(ctx context.Context, db *gorm.DB, shards []int32) ([]storage.Mark, error) {
	var got []storage.Mark
	if len(shards) > 0 {
		if err := db.WithContext(ctx).Raw(`SELECT shard, published_through AS seq, published_offset AS ` + "`offset`" + `, published_epoch AS epoch FROM ` + s.relayTable() + ` WHERE shard IN (` + intList(shards) + `)`).Scan(&got).Error; err != nil {
			return nil, fmt.Errorf("mysql: read the marks of %s: %w", s.tbl.name, err)
		}
	}
	return storage.MarksInOrder(shards, got)
}

// Release ends relay's leases.
func (s *OutboxStore) Release(ctx context.Context, db *gorm.DB, relay string) error {
	if err := db.WithContext(ctx).Exec(`UPDATE `+s.relayTable()+` SET lease_until = `+leaseNever+` WHERE owner = ?`, []byte(relay)).Error; err != nil {
		return fmt.Errorf("mysql: release leases on %s: %w", s.tbl.name, err)
	}
	return nil
}

// IsRetryable is the inbox Store's classification (see Store.IsRetryable).
func (s *OutboxStore) IsRetryable(err error) bool { return s.tbl.IsRetryable(err) }

// IsMissingTable is the inbox Store's classification (see
// Store.IsMissingTable).
func (s *OutboxStore) IsMissingTable(err error) bool { return s.tbl.IsMissingTable(err) }

// Source returns the table's source id and epoch.
func (s *OutboxStore) Source(ctx context.Context, db *gorm.DB) (string, int64, error) {
	var got []struct {
		Source []byte
		Epoch  int64
	}
	if err := db.WithContext(ctx).Raw(`SELECT source, epoch FROM ` + s.sourceTable() + ` WHERE id = 1`).Scan(&got).Error; err != nil {
		return "", 0, fmt.Errorf("mysql: read the source of %s: %w", s.tbl.name, err)
	}
	if len(got) == 0 {
		return "", 0, fmt.Errorf("mysql: %s has no source row; run Migrate", s.sourceTable())
	}
	return string(got[0].Source), got[0].Epoch, nil
}

// Shards returns the store's shard count, OutboxOptions.Shards (or
// DefaultShards).
func (s *OutboxStore) Shards() int { return s.shards }

// BumpEpoch raises the table's epoch by one and reads it back, in one
// short transaction (the row lock of the UPDATE holds until the read).
func (s *OutboxStore) BumpEpoch(ctx context.Context, db *gorm.DB) (int64, error) {
	var epochs []int64
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`UPDATE ` + s.sourceTable() + ` SET epoch = epoch + 1, epoch_at = CURRENT_TIMESTAMP(6) WHERE id = 1`).Error; err != nil {
			return fmt.Errorf("mysql: raise the epoch of %s: %w", s.tbl.name, err)
		}
		if err := tx.Raw(`SELECT epoch FROM ` + s.sourceTable() + ` WHERE id = 1`).Scan(&epochs).Error; err != nil {
			return fmt.Errorf("mysql: read the epoch of %s: %w", s.tbl.name, err)
		}
		return nil
	}, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, err
	}
	if len(epochs) == 0 {
		return 0, fmt.Errorf("mysql: %s has no source row; run Migrate", s.sourceTable())
	}
	return epochs[0], nil
}

// Maintain prepares the days from plan.Today through plan.PrepareThrough
// like the inbox Store, drops the partitions holding only days before
// plan.ExpireBefore whose rows are all published, and deletes the published
// rows of expired days from partitions it keeps, in batches. Days with
// unpublished rows are reported in Held.
func (s *OutboxStore) Maintain(ctx context.Context, db *gorm.DB, plan storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	var report storage.MaintenanceReport
	run := func(conn *gorm.DB) error {
		var err error
		report, err = s.maintain(conn, plan)
		return err
	}
	if plan.DryRun {
		return report, run(db.WithContext(ctx))
	}
	return report, s.tbl.withLock(ctx, db, run)
}

func (s *OutboxStore) maintain(db *gorm.DB, plan storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	report := storage.MaintenanceReport{DryRun: plan.DryRun}
	parts, err := s.tbl.readPartitions(db)
	if err != nil {
		return report, err
	}
	if report.Prepared, parts, err = s.tbl.prepareDays(db, parts, plan); err != nil {
		return report, err
	}
	cutoff := storage.DayOf(plan.ExpireBefore)
	unpublished := func(part string) (bool, error) {
		var held bool
		err := db.Raw(`SELECT EXISTS (SELECT 1 FROM ` + s.relayTable() + ` r WHERE EXISTS (SELECT 1 FROM ` + s.tbl.table + ` PARTITION (` + quoteName(part) + `) o
			WHERE o.shard = r.shard AND o.seq > r.published_through))`).Row().Scan(&held)
		if err != nil {
			return false, fmt.Errorf("mysql: look for unpublished rows in partition %s of %s: %w", part, s.tbl.name, err)
		}
		return held, nil
	}
	// Partitions that hold expired days only: every one but the catch-all
	// whose bound is at or before the cutoff. (A dropped lowest partition's
	// role, catching every earlier day, passes to the next one.)
	var drop []string
	for i, p := range parts {
		if p.max || p.bound.After(cutoff) || i == len(parts)-2 {
			// Keep at least one dated partition below the catch-all.
			break
		}
		held, err := unpublished(p.name)
		if err != nil {
			return report, err
		}
		day := p.bound.AddDate(0, 0, -1)
		if held {
			report.Held = append(report.Held, day)
			continue
		}
		drop = append(drop, quoteName(p.name))
		report.Expired = append(report.Expired, day)
	}
	if len(drop) > 0 {
		report.RowsRemoved = -1
		if !plan.DryRun {
			if err := db.Exec("ALTER TABLE " + s.tbl.table + " DROP PARTITION " + strings.Join(drop, ", ")).Error; err != nil {
				return report, fmt.Errorf("mysql: drop expired partitions %s of %s: %w", strings.Join(drop, ", "), s.tbl.name, err)
			}
		}
	}
	// What is left of expired days in kept partitions: published rows go,
	// unpublished ones are reported.
	var left []struct {
		Day         string
		Unpublished int64
	}
	if err := db.Raw(`SELECT CAST(o.day AS CHAR) AS day, CAST(SUM(o.seq > r.published_through) AS SIGNED) AS unpublished
		FROM `+s.tbl.table+` o JOIN `+s.relayTable()+` r ON r.shard = o.shard WHERE o.day < ? GROUP BY o.day`, dayText(cutoff)).Scan(&left).Error; err != nil {
		return report, fmt.Errorf("mysql: look for expired rows of %s: %w", s.tbl.name, err)
	}
	for _, l := range left {
		d, err := time.Parse(time.DateOnly, l.Day)
		if err != nil {
			return report, fmt.Errorf("mysql: %s holds a malformed day %q: %w", s.tbl.name, l.Day, err)
		}
		days := &report.Expired
		if l.Unpublished > 0 {
			days = &report.Held
		}
		if !slices.ContainsFunc(*days, d.Equal) {
			*days = append(*days, d)
		}
	}
	slices.SortFunc(report.Expired, time.Time.Compare)
	slices.SortFunc(report.Held, time.Time.Compare)
	if plan.DryRun {
		return report, nil
	}
	q := `DELETE FROM ` + s.tbl.table + ` WHERE day < ? AND seq <= (SELECT r.published_through FROM ` + s.relayTable() + ` r WHERE r.shard = ` + s.tbl.table + `.shard) LIMIT ?`
	for {
		res := db.Exec(q, dayText(cutoff), s.tbl.deleteBatch)
		if res.Error != nil {
			return report, fmt.Errorf("mysql: delete published rows before %s from %s: %w", dayText(cutoff), s.tbl.name, res.Error)
		}
		if report.RowsRemoved >= 0 {
			report.RowsRemoved += res.RowsAffected
		}
		if res.RowsAffected < int64(s.tbl.deleteBatch) {
			return report, nil
		}
		if err := db.Statement.Context.Err(); err != nil {
			return report, err
		}
	}
}

// Verify checks the server (MariaDB 10.6+ or MySQL 8.0+, for SKIP LOCKED),
// a strict sql_mode, and that the outbox table is InnoDB and partitioned by
// RANGE COLUMNS(day) with a catch-all.
func (s *OutboxStore) Verify(ctx context.Context, db *gorm.DB) error {
	db = db.WithContext(ctx)
	server, problems, err := sessionProblems(ctx, db)
	if err != nil {
		return err
	}
	if !server.Supported() || (server.MariaDB && server.Major == 10 && server.Minor < 6) {
		problems = append(problems, fmt.Errorf("server %s lacks SKIP LOCKED (MySQL 8.0+ or MariaDB 10.6+)", server))
	}
	if err := s.tbl.checkEngine(db); err != nil {
		problems = append(problems, err)
	}
	if _, err := s.tbl.readPartitions(db); err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return fmt.Errorf("mysql: unsafe outbox settings on %s: %w", server, errors.Join(problems...))
	}
	return nil
}

// Stats counts rows and unpublished rows per day.
func (s *OutboxStore) Stats(ctx context.Context, db *gorm.DB) ([]storage.DayStats, error) {
	var raw []struct {
		Day         string
		Rows        int64
		Unpublished int64
	}
	err := db.WithContext(ctx).Raw(`SELECT CAST(o.day AS CHAR) AS day, COUNT(*) AS ` + "`rows`" + `, CAST(SUM(o.seq > r.published_through) AS SIGNED) AS unpublished
		FROM ` + s.tbl.table + ` o JOIN ` + s.relayTable() + ` r ON r.shard = o.shard GROUP BY o.day ORDER BY o.day`).Scan(&raw).Error
	if err != nil {
		return nil, fmt.Errorf("mysql: stats of %s: %w", s.tbl.name, err)
	}
	out := make([]storage.DayStats, 0, len(raw))
	for _, r := range raw {
		d, err := time.Parse(time.DateOnly, r.Day)
		if err != nil {
			return nil, fmt.Errorf("mysql: %s holds a malformed day %q: %w", s.tbl.name, r.Day, err)
		}
		out = append(out, storage.DayStats{Day: d, Rows: r.Rows, Unpublished: r.Unpublished})
	}
	return out, nil
}

var (
	_ storage.OutboxStore   = (*OutboxStore)(nil)
	_ storage.StatsReporter = (*OutboxStore)(nil)
	_ storage.Verifier      = (*OutboxStore)(nil)
	_ storage.SchemaPrinter = (*OutboxStore)(nil)
	_ storage.Sequenced     = (*OutboxStore)(nil)
	_ storage.Sharded       = (*OutboxStore)(nil)
	_ storage.MarkReader    = (*OutboxStore)(nil)
	_ storage.SourceClaimer = (*OutboxStore)(nil)
)

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
