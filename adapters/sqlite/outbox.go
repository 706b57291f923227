package sqlite

import (
	"cmp"
	"context"
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
	// Table is the outbox table; its shards live in <Table>_shards, its
	// source id and epoch in <Table>_source. Default DefaultOutboxTable.
	Table string
	// Shards is the number of shards, fixed when the table is made.
	// Default DefaultShards.
	Shards int
	// DeleteBatch is how many rows one expiry transaction deletes. Default
	// 1000.
	DeleteBatch int
}

// OutboxStore is the SQLite outbox Store.
//
// SQLite has one writer at a time, and that is how it orders keys: an
// enqueuing transaction holds the write lock from BEGIN IMMEDIATE to its
// end, so transactions take their sequence numbers one after the other, in
// commit order. Several relays may run: they coordinate through the leases
// in the shards table, each claim a short write transaction (there are no
// row locks to skip; a claim waits for the write lock instead, within the
// busy timeout). One relay is enough for SQLite's write rate; a second one
// only stands by. Expiry deletes published rows of expired days in small
// batches; unpublished rows are never deleted. The table's source id and
// epoch (storage.Sequenced) are the one row of <table>_source.
type OutboxStore struct {
	table, shardsTable, sourceTable string
	shards                          int
	deleteBatch                     int
}

// NewOutbox validates opts and returns an OutboxStore. It does not touch
// the database.
func NewOutbox(opts OutboxOptions) (*OutboxStore, error) {
	opts.Table = cmp.Or(opts.Table, DefaultOutboxTable)
	if err := storage.ValidateIdentifier("table name", opts.Table+"_shards"); err != nil {
		return nil, err
	}
	if opts.Shards < 0 || opts.Shards > 1<<16 || opts.DeleteBatch < 0 {
		return nil, fmt.Errorf("%w: shards %d (1..65536) or delete batch %d", storage.ErrInvalidConfig, opts.Shards, opts.DeleteBatch)
	}
	return &OutboxStore{table: opts.Table, shardsTable: opts.Table + "_shards", sourceTable: opts.Table + "_source",
		shards: cmp.Or(opts.Shards, DefaultShards), deleteBatch: cmp.Or(opts.DeleteBatch, 1000)}, nil
}

// Table returns the outbox table name.
func (s *OutboxStore) Table() string { return s.table }

// createStatements make the tables. The source table comes first: on a
// database without it, that statement is the transaction's first write and
// takes the write lock before the transaction has read anything (a
// transaction that read first and then writes fails at once with
// SQLITE_BUSY when another one is writing, without the busy timeout).
func (s *OutboxStore) createStatements() []string {
	return []string{
		// One row: the table's source id (made once, by Migrate) and epoch
		// (raised by BumpEpoch), for the relay's sequence headers.
		`CREATE TABLE IF NOT EXISTS ` + s.sourceTable + ` (
			id         INTEGER PRIMARY KEY CHECK (id = 1),
			source     TEXT    NOT NULL,
			epoch      INTEGER NOT NULL DEFAULT 1 CHECK (epoch >= 1),
			created_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
			epoch_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
		) STRICT`,
		`CREATE TABLE IF NOT EXISTS ` + s.table + ` (
			shard      INTEGER NOT NULL,
			seq        INTEGER NOT NULL,
			day        TEXT    NOT NULL,
			event_id   TEXT    NOT NULL,
			topic      TEXT    NOT NULL,
			msg_key    BLOB,
			msg_value  BLOB    NOT NULL,
			headers    BLOB    NOT NULL,
			created_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
			PRIMARY KEY (shard, seq)
		) STRICT`,
		`CREATE INDEX IF NOT EXISTS ` + s.table + `_day ON ` + s.table + ` (day)`,
		// next_seq is the last number handed out; published_through the
		// last one published; lease_until in Unix milliseconds.
		`CREATE TABLE IF NOT EXISTS ` + s.shardsTable + ` (
			shard             INTEGER PRIMARY KEY,
			next_seq          INTEGER NOT NULL DEFAULT 0,
			published_through INTEGER NOT NULL DEFAULT 0,
			owner             TEXT    NOT NULL DEFAULT '',
			lease_until       INTEGER NOT NULL DEFAULT 0,
			published_offset  INTEGER NOT NULL DEFAULT 0,
			published_epoch   INTEGER NOT NULL DEFAULT 0
		) STRICT`,
	}
}

// shardRows inserts the shards' rows that are missing.
func (s *OutboxStore) shardRows() string {
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + s.shardsTable + ` (shard) VALUES `)
	for i := range s.shards {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(" + strconv.Itoa(i) + ")")
	}
	b.WriteString(` ON CONFLICT (shard) DO NOTHING`)
	return b.String()
}

// sourceRow inserts the source row, with the source id value (a bound
// parameter or an SQL expression), unless there is one.
func (s *OutboxStore) sourceRow(value string) string {
	return `INSERT INTO ` + s.sourceTable + ` (id, source) VALUES (1, ` + value + `) ON CONFLICT (id) DO NOTHING`
}

// MigrationSQL returns Migrate's statements; SQLite has no partitions to
// prepare. The source id is made by the database when the statements run.
func (s *OutboxStore) MigrationSQL(storage.MaintenancePlan) ([]string, error) {
	return append(s.createStatements(), s.shardRows(), s.sourceRow(`lower(hex(randomblob(16)))`)), nil
}

// Migrate creates the tables, the shards and the source row (a new source
// id, epoch 1), and refuses a shards table with another number of shards.
// It writes only what is missing, in one transaction: SQLite's single
// writer serialises concurrent calls, so one of them makes the source id
// and the others find it.
func (s *OutboxStore) Migrate(ctx context.Context, db *gorm.DB) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		for _, q := range s.createStatements() {
			if err := tx.Exec(q).Error; err != nil {
				return fmt.Errorf("sqlite: migrate %s: %w", s.table, err)
			}
		}
		// Read before writing: a Migrate that finds everything in place
		// writes nothing, so it never waits for the write lock (see
		// createStatements).
		var sources int64
		if err := tx.Raw(`SELECT COUNT(*) FROM ` + s.sourceTable).Scan(&sources).Error; err != nil {
			return fmt.Errorf("sqlite: read the source of %s: %w", s.table, err)
		}
		if sources == 0 {
			if err := tx.Exec(s.sourceRow("?"), storage.NewSourceID()).Error; err != nil {
				return fmt.Errorf("sqlite: make the source of %s: %w", s.table, err)
			}
		}
		// A shards table made before published_offset and published_epoch
		// (storage.Mark.Offset, Epoch) gains them; SQLite has no ADD COLUMN
		// IF NOT EXISTS.
		for _, col := range []string{"published_offset", "published_epoch"} {
			var has int64
			if err := tx.Raw(`SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?`, s.shardsTable, col).Scan(&has).Error; err != nil {
				return fmt.Errorf("sqlite: read the columns of %s: %w", s.shardsTable, err)
			}
			if has == 0 {
				if err := tx.Exec(`ALTER TABLE ` + s.shardsTable + ` ADD COLUMN ` + col + ` INTEGER NOT NULL DEFAULT 0`).Error; err != nil {
					return fmt.Errorf("sqlite: add %s to %s: %w", col, s.shardsTable, err)
				}
			}
		}
		var have struct{ N, Top int64 }
		if err := tx.Raw(`SELECT COUNT(*) AS n, COALESCE(MAX(shard), -1) AS top FROM ` + s.shardsTable).Scan(&have).Error; err != nil {
			return fmt.Errorf("sqlite: count shards of %s: %w", s.table, err)
		}
		if have.N == 0 {
			if err := tx.Exec(s.shardRows()).Error; err != nil {
				return fmt.Errorf("sqlite: create shards of %s: %w", s.table, err)
			}
			return nil
		}
		if have.N != int64(s.shards) || have.Top != int64(s.shards-1) {
			return fmt.Errorf("%w: outbox table %s has %d shards, the store is configured with %d; changing it would move keys to other shards and break their order",
				storage.ErrInvalidConfig, s.table, have.N, s.shards)
		}
		return nil
	})
}

// Append numbers rows in their shards and inserts them.
func (s *OutboxStore) Append(ctx context.Context, tx *gorm.DB, rows []storage.OutboxRow) error {
	tx = tx.WithContext(ctx)
	first := map[int32]int64{}
	for _, c := range storage.AssignShards(rows, s.shards) {
		var last int64
		if err := tx.Raw(`UPDATE `+s.shardsTable+` SET next_seq = next_seq + ? WHERE shard = ? RETURNING next_seq`, c.Rows, c.Shard).Scan(&last).Error; err != nil {
			return fmt.Errorf("sqlite: number rows of shard %d of %s: %w", c.Shard, s.table, err)
		}
		if last < c.Rows {
			return fmt.Errorf("sqlite: shard %d of %s has no counter row; run Migrate", c.Shard, s.table)
		}
		first[c.Shard] = last - c.Rows + 1
	}
	storage.NumberRows(rows, first)
	const perRow = 8
	for lo := 0; lo < len(rows); lo += 32766 / perRow {
		hi := min(lo+32766/perRow, len(rows))
		var b strings.Builder
		b.WriteString(`INSERT INTO ` + s.table + ` (shard, seq, day, event_id, topic, msg_key, msg_value, headers) VALUES `)
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
			return fmt.Errorf("sqlite: insert into %s: %w", s.table, err)
		}
	}
	return nil
}

// nowMillis is the database's clock in Unix milliseconds.
const nowMillis = `CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)`

type leased struct {
	Shard            int32
	PublishedThrough int64
	NextSeq          int64
	Source           *string // with the source asked for
	Epoch            *int64
}

type storedRow struct {
	Shard    int32
	Seq      int64
	Day      string
	EventID  string
	Topic    string
	MsgKey   []byte
	MsgValue []byte
	Headers  []byte
}

// Claim leases shards with unpublished rows in one write transaction and
// reads their oldest rows.
func (s *OutboxStore) Claim(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, error) {
	rows, _, _, err := s.claim(ctx, db, req, false)
	return rows, err
}

// ClaimSource claims as Claim does and reads the source row in the lease's
// statement (storage.SourceClaimer): with one connection in the pool, as
// the package doc advises where latency matters, the relay waits for it
// once a cycle instead of twice.
func (s *OutboxStore) ClaimSource(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, string, int64, error) {
	return s.claim(ctx, db, req, true)
}

func (s *OutboxStore) claim(ctx context.Context, db *gorm.DB, req storage.ClaimRequest, withSource bool) ([]storage.OutboxRow, string, int64, error) {
	maxShards := req.MaxShards
	if maxShards <= 0 {
		maxShards = s.shards
	}
	var rows []storage.OutboxRow
	var source string
	var epoch int64
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var got []leased
		sourceCols := ""
		if withSource {
			sourceCols = `, (SELECT source FROM ` + s.sourceTable + ` WHERE id = 1) AS source, (SELECT epoch FROM ` + s.sourceTable + ` WHERE id = 1) AS epoch`
		}
		err := tx.Raw(`UPDATE `+s.shardsTable+` SET owner = ?, lease_until = `+nowMillis+` + ?
			WHERE shard IN (SELECT shard FROM `+s.shardsTable+`
			                 WHERE next_seq > published_through AND (owner = ? OR lease_until < `+nowMillis+`)
			                 ORDER BY shard LIMIT ?)
			RETURNING shard, published_through, next_seq`+sourceCols, req.Relay, req.Lease.Milliseconds(), req.Relay, maxShards).Scan(&got).Error
		if err != nil {
			return fmt.Errorf("sqlite: lease shards of %s: %w", s.table, err)
		}
		if withSource && len(got) > 0 {
			if got[0].Source == nil || got[0].Epoch == nil {
				return fmt.Errorf("sqlite: %s has no source row; run Migrate", s.sourceTable)
			}
			source, epoch = *got[0].Source, *got[0].Epoch
		}
		slices.SortFunc(got, func(a, b leased) int { return cmp.Compare(a.Shard, b.Shard) })
		pending := make([]storage.ShardCount, len(got))
		through := make(map[int32]int64, len(got))
		for i, l := range got {
			pending[i] = storage.ShardCount{Shard: l.Shard, Rows: l.NextSeq - l.PublishedThrough}
			through[l.Shard] = l.PublishedThrough
		}
		for _, sh := range storage.ShareRows(pending, req.MaxRows) {
			var part []storedRow
			if err := tx.Raw(`SELECT shard, seq, day, event_id, topic, msg_key, msg_value, headers FROM `+s.table+`
				WHERE shard = ? AND seq > ? ORDER BY seq LIMIT ?`, sh.Shard, through[sh.Shard], sh.Rows).Scan(&part).Error; err != nil {
				return fmt.Errorf("sqlite: read shard %d of %s: %w", sh.Shard, s.table, err)
			}
			for _, p := range part {
				day, err := time.Parse(time.DateOnly, p.Day)
				if err != nil {
					return fmt.Errorf("sqlite: %s holds a malformed day %q: %w", s.table, p.Day, err)
				}
				rows = append(rows, storage.OutboxRow{Shard: p.Shard, Seq: p.Seq, Day: day, EventID: p.EventID, Topic: p.Topic,
					Key: p.MsgKey, Value: p.MsgValue, Headers: p.Headers})
			}
		}
		return nil
	})
	if err != nil {
		return nil, "", 0, err
	}
	return rows, source, epoch, nil
}

// Ack moves the published marks of the shards relay holds.
func (s *OutboxStore) Ack(ctx context.Context, db *gorm.DB, relay string, marks []storage.Mark) error {
	var lost []int32
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		lost = lost[:0]
		for _, m := range marks {
			// A mark naming its event moves only over that event's row: a
			// database that went back under the relay holds another one
			// there, or none.
			res := tx.Exec(`UPDATE `+s.shardsTable+` SET published_through = MAX(published_through, ?),
				published_offset = CASE WHEN ? > published_through THEN ? ELSE published_offset END,
				published_epoch = CASE WHEN ? > published_through THEN ? ELSE published_epoch END WHERE shard = ? AND owner = ?
				AND (? = '' OR EXISTS (SELECT 1 FROM `+s.table+` o WHERE o.shard = ? AND o.seq = ? AND o.event_id = ?))`,
				m.Seq, m.Seq, m.Offset, m.Seq, m.Epoch, m.Shard, relay, m.EventID, m.Shard, m.Seq, m.EventID)
			if res.Error != nil {
				return fmt.Errorf("sqlite: mark shard %d of %s published: %w", m.Shard, s.table, res.Error)
			}
			if res.RowsAffected == 0 {
				lost = append(lost, m.Shard)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(lost) > 0 {
		return fmt.Errorf("%w: shards %v of %s", storage.ErrLeaseLost, lost, s.table)
	}
	return nil
}

// Marks reads the shards' marks and stored offsets.
func (s *OutboxStore) Marks(ctx context.Context, db *gorm.DB, shards []int32) ([]storage.Mark, error) {
	var got []storage.Mark
	if len(shards) > 0 {
		if err := db.WithContext(ctx).Raw(`SELECT shard, published_through AS seq, published_offset AS "offset", published_epoch AS epoch FROM `+s.shardsTable+` WHERE shard IN ?`, shards).Scan(&got).Error; err != nil {
			return nil, fmt.Errorf("sqlite: read the marks of %s: %w", s.table, err)
		}
	}
	return storage.MarksInOrder(shards, got)
}

// Release ends relay's leases.
func (s *OutboxStore) Release(ctx context.Context, db *gorm.DB, relay string) error {
	if err := db.WithContext(ctx).Exec(`UPDATE `+s.shardsTable+` SET lease_until = 0 WHERE owner = ?`, relay).Error; err != nil {
		return fmt.Errorf("sqlite: release leases on %s: %w", s.table, err)
	}
	return nil
}

type dayCount struct {
	Day         string
	Rows        int64
	Unpublished int64
}

func (s *OutboxStore) dayCounts(db *gorm.DB, before string) ([]dayCount, error) {
	q := `SELECT o.day AS day, COUNT(*) AS rows, SUM(o.seq > sh.published_through) AS unpublished
		FROM ` + s.table + ` o JOIN ` + s.shardsTable + ` sh ON sh.shard = o.shard`
	var args []any
	if before != "" {
		q += ` WHERE o.day < ?`
		args = append(args, before)
	}
	var got []dayCount
	if err := db.Raw(q+` GROUP BY o.day ORDER BY o.day`, args...).Scan(&got).Error; err != nil {
		return nil, fmt.Errorf("sqlite: count rows of %s by day: %w", s.table, err)
	}
	return got, nil
}

// Maintain deletes the published rows of days before plan.ExpireBefore in
// batches, each its own transaction; days with unpublished rows are
// reported in Held. There is nothing to prepare.
func (s *OutboxStore) Maintain(ctx context.Context, db *gorm.DB, plan storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	db = db.WithContext(ctx)
	cutoff := dayText(plan.ExpireBefore)
	counts, err := s.dayCounts(db, cutoff)
	if err != nil {
		return storage.MaintenanceReport{}, err
	}
	var report storage.MaintenanceReport
	for _, c := range counts {
		d, err := time.Parse(time.DateOnly, c.Day)
		if err != nil {
			return report, fmt.Errorf("sqlite: %s holds a malformed day %q: %w", s.table, c.Day, err)
		}
		if c.Unpublished > 0 {
			report.Held = append(report.Held, d)
		} else {
			report.Expired = append(report.Expired, d)
		}
		if plan.DryRun {
			report.RowsRemoved += c.Rows - c.Unpublished
		}
	}
	if plan.DryRun {
		return report, nil
	}
	del := `DELETE FROM ` + s.table + ` WHERE rowid IN (SELECT o.rowid FROM ` + s.table + ` o JOIN ` + s.shardsTable + ` sh ON sh.shard = o.shard
		WHERE o.day < ? AND o.seq <= sh.published_through LIMIT ?)`
	for {
		res := db.Exec(del, cutoff, s.deleteBatch)
		if res.Error != nil {
			return report, fmt.Errorf("sqlite: expire published rows before %s from %s: %w", cutoff, s.table, res.Error)
		}
		report.RowsRemoved += res.RowsAffected
		if res.RowsAffected < int64(s.deleteBatch) {
			return report, nil
		}
		if err := ctx.Err(); err != nil {
			return report, err
		}
	}
}

// Stats counts rows and unpublished rows per day.
func (s *OutboxStore) Stats(ctx context.Context, db *gorm.DB) ([]storage.DayStats, error) {
	counts, err := s.dayCounts(db.WithContext(ctx), "")
	if err != nil {
		return nil, err
	}
	out := make([]storage.DayStats, 0, len(counts))
	for _, c := range counts {
		d, err := time.Parse(time.DateOnly, c.Day)
		if err != nil {
			return nil, fmt.Errorf("sqlite: %s holds a malformed day %q: %w", s.table, c.Day, err)
		}
		out = append(out, storage.DayStats{Day: d, Rows: c.Rows, Unpublished: c.Unpublished})
	}
	return out, nil
}

// Source returns the table's source id and epoch.
func (s *OutboxStore) Source(ctx context.Context, db *gorm.DB) (string, int64, error) {
	var got []struct {
		Source string
		Epoch  int64
	}
	if err := db.WithContext(ctx).Raw(`SELECT source, epoch FROM ` + s.sourceTable + ` WHERE id = 1`).Scan(&got).Error; err != nil {
		return "", 0, fmt.Errorf("sqlite: read the source of %s: %w", s.table, err)
	}
	if len(got) == 0 {
		return "", 0, fmt.Errorf("sqlite: %s has no source row; run Migrate", s.sourceTable)
	}
	return got[0].Source, got[0].Epoch, nil
}

var _ storage.SourceClaimer = (*OutboxStore)(nil)

// Shards returns the store's shard count, OutboxOptions.Shards (or
// DefaultShards).
func (s *OutboxStore) Shards() int { return s.shards }

// BumpEpoch raises the table's epoch by one.
func (s *OutboxStore) BumpEpoch(ctx context.Context, db *gorm.DB) (int64, error) {
	var epochs []int64
	if err := db.WithContext(ctx).Raw(`UPDATE ` + s.sourceTable + ` SET epoch = epoch + 1, epoch_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
		WHERE id = 1 RETURNING epoch`).Scan(&epochs).Error; err != nil {
		return 0, fmt.Errorf("sqlite: raise the epoch of %s: %w", s.table, err)
	}
	if len(epochs) == 0 {
		return 0, fmt.Errorf("sqlite: %s has no source row; run Migrate", s.sourceTable)
	}
	return epochs[0], nil
}

// Verify checks the connection's settings as the inbox Store does (WAL, a
// busy timeout, synchronous FULL: with NORMAL a power loss can undo the
// commit of a message, which is then never published).
func (s *OutboxStore) Verify(ctx context.Context, db *gorm.DB) error { return verifySettings(ctx, db) }

// IsRetryable is the inbox Store's classification: SQLITE_BUSY and
// SQLITE_LOCKED.
func (s *OutboxStore) IsRetryable(err error) bool { return isRetryable(err) }

// IsMissingTable is the inbox Store's classification (see
// Store.IsMissingTable).
func (s *OutboxStore) IsMissingTable(err error) bool { return noSuchTable(err) }

var (
	_ storage.OutboxStore   = (*OutboxStore)(nil)
	_ storage.StatsReporter = (*OutboxStore)(nil)
	_ storage.Verifier      = (*OutboxStore)(nil)
	_ storage.SchemaPrinter = (*OutboxStore)(nil)
	_ storage.Sequenced     = (*OutboxStore)(nil)
	_ storage.Sharded       = (*OutboxStore)(nil)
	_ storage.MarkReader    = (*OutboxStore)(nil)
)
