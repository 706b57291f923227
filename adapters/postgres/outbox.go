package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
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
	// Schema holds the outbox tables; created by Migrate if missing.
	// Default DefaultSchema.
	Schema string
	// Table is the partitioned outbox table, at most MaxTableBytes bytes;
	// <Table>_shards numbers the rows of each shard, <Table>_relay holds
	// each shard's published mark and relay lease, and <Table>_source the
	// table's source id and epoch. Default DefaultOutboxTable.
	Table string
	// Shards is the number of shards, fixed when the tables are made.
	// Enqueuing transactions whose keys fall in one shard take turns, so more
	// shards mean less waiting, and more rows for relays to lease. Default
	// DefaultShards.
	Shards int
	// LockTimeout bounds how long a maintenance step waits for its lock on
	// the outbox table. Default DefaultLockTimeout.
	LockTimeout time.Duration
}

// OutboxStore is the PostgreSQL outbox Store. It is safe for concurrent
// use.
//
// Rows are numbered per shard from a counter row in <table>_shards that
// Append updates, so the row lock on it orders the enqueuing transactions
// of a shard: a lower number always commits first. Relays lease shards in
// <table>_relay with SELECT ... FOR UPDATE SKIP LOCKED and an expiry timed by
// the database's clock, and mark a shard published through a number with
// one UPDATE: no outbox row is ever updated.
//
// The outbox table is partitioned by RANGE on the day the row was enqueued,
// like the inbox table (partitions <table>_pYYYYMMDD, and a DEFAULT
// partition for days without one). Maintain drops a day's partition only
// when none of its rows lies beyond its shard's published mark, checked under
// the lock that detaches it (one index probe per shard): an unpublished row
// is never dropped; such a day is reported in Held.
//
// The table's source id and epoch (storage.Sequenced) are the one row of
// <table>_source, made by Migrate under its advisory lock.
type OutboxStore struct {
	tbl    *Store // the outbox table's names, advisory lock and partition helpers
	shards int
}

// NewOutbox validates opts and returns an OutboxStore. It does not touch
// the database.
func NewOutbox(opts OutboxOptions) (*OutboxStore, error) {
	opts.Schema = cmp.Or(opts.Schema, DefaultSchema)
	opts.Table = cmp.Or(opts.Table, DefaultOutboxTable)
	if opts.Shards < 0 || opts.Shards > 1<<16 {
		return nil, fmt.Errorf("%w: %d shards, want 1..65536", storage.ErrInvalidConfig, opts.Shards)
	}
	// The inbox Store's checks of names and timeouts hold here as well.
	tbl, err := New(Options{Schema: opts.Schema, Table: opts.Table, LockTimeout: opts.LockTimeout})
	if err != nil {
		return nil, err
	}
	h := fnv.New64a()
	h.Write([]byte("github.com/inboxgo/inbox/adapters/postgres/outbox\x00" + opts.Schema + "\x00" + opts.Table))
	tbl.lockKey = int64(h.Sum64())
	return &OutboxStore{tbl: tbl, shards: cmp.Or(opts.Shards, DefaultShards)}, nil
}

// Schema returns the schema of the outbox tables.
func (s *OutboxStore) Schema() string { return s.tbl.schema }

// Table returns the outbox table name.
func (s *OutboxStore) Table() string { return s.tbl.table }

func (s *OutboxStore) parent() string { return s.tbl.parent() }
func (s *OutboxStore) shardsTable() string {
	return s.tbl.qualified(s.tbl.table + "_shards")
}
func (s *OutboxStore) relayTable() string  { return s.tbl.qualified(s.tbl.table + "_relay") }
func (s *OutboxStore) sourceTable() string { return s.tbl.qualified(s.tbl.table + "_source") }

// sourceRow inserts the source row, with the source id value (a bound
// parameter or an SQL expression), unless there is one.
func (s *OutboxStore) sourceRow(value string) string {
	return `INSERT INTO ` + s.sourceTable() + ` (id, source) VALUES (1, ` + value + `) ON CONFLICT (id) DO NOTHING`
}

func (s *OutboxStore) createStatements() []string {
	n := strconv.Itoa(s.shards - 1)
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + s.parent() + ` (
			shard      integer     NOT NULL,
			seq        bigint      NOT NULL,
			day        date        NOT NULL,
			event_id   text        NOT NULL,
			topic      text        NOT NULL,
			msg_key    bytea,
			msg_value  bytea       NOT NULL,
			headers    bytea       NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now(),
			CONSTRAINT ` + quoteIdent(s.tbl.table+"_pkey") + ` PRIMARY KEY (shard, seq, day)
		) PARTITION BY RANGE (day)`,
		`CREATE TABLE IF NOT EXISTS ` + s.tbl.qualified(s.tbl.defaultPartition()) + ` PARTITION OF ` + s.parent() + ` DEFAULT`,
		`CREATE INDEX IF NOT EXISTS ` + quoteIdent(s.tbl.table+"_dday") + ` ON ` + s.tbl.qualified(s.tbl.defaultPartition()) + ` (day)`,
		// next_seq is the last number handed out in the shard.
		`CREATE TABLE IF NOT EXISTS ` + s.shardsTable() + ` (
			shard    integer PRIMARY KEY,
			next_seq bigint  NOT NULL DEFAULT 0
		)`,
		`CREATE TABLE IF NOT EXISTS ` + s.relayTable() + ` (
			shard             integer     PRIMARY KEY,
			published_through bigint      NOT NULL DEFAULT 0,
			owner             text        NOT NULL DEFAULT '',
			lease_until       timestamptz NOT NULL DEFAULT '-infinity'
		)`,
		// Where the relay starts reading the shard's partition, and the epoch
		// of the row at the mark (storage.Mark.Offset, Epoch);
		// added to relay tables made before it.
		`ALTER TABLE ` + s.relayTable() + ` ADD COLUMN IF NOT EXISTS published_offset bigint NOT NULL DEFAULT 0, ADD COLUMN IF NOT EXISTS published_epoch bigint NOT NULL DEFAULT 0`,
		// One row: the table's source id (made once, by Migrate) and epoch
		// (raised by BumpEpoch), for the relay's sequence headers.
		`CREATE TABLE IF NOT EXISTS ` + s.sourceTable() + ` (
			id         smallint    PRIMARY KEY CHECK (id = 1),
			source     text        NOT NULL,
			epoch      bigint      NOT NULL DEFAULT 1 CHECK (epoch >= 1),
			created_at timestamptz NOT NULL DEFAULT now(),
			epoch_at   timestamptz NOT NULL DEFAULT now()
		)`,
		`INSERT INTO ` + s.shardsTable() + ` (shard) SELECT g FROM generate_series(0, ` + n + `) g ON CONFLICT DO NOTHING`,
		`INSERT INTO ` + s.relayTable() + ` (shard) SELECT g FROM generate_series(0, ` + n + `) g ON CONFLICT DO NOTHING`,
	}
}

// Migrate creates the schema if it is missing (as the inbox Store's
// Migrate does), the tables, the shards and the source row (a new source
// id, epoch 1) in one transaction under the store's advisory lock, and
// refuses tables made with another number of shards. The lock serialises
// concurrent calls: the first makes the source id, the others keep it.
func (s *OutboxStore) Migrate(ctx context.Context, db *gorm.DB) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := s.tbl.createSchema(tx); err != nil {
			return err
		}
		if err := s.tbl.lock(tx); err != nil {
			return err
		}
		for _, q := range s.createStatements() {
			if err := tx.Exec(q).Error; err != nil {
				return fmt.Errorf("postgres: migrate %s: %w", s.parent(), err)
			}
		}
		if err := tx.Exec(s.sourceRow("?"), storage.NewSourceID()).Error; err != nil {
			return fmt.Errorf("postgres: make the source of %s: %w", s.parent(), err)
		}
		var have struct{ Shards, Relay, Top int64 }
		if err := tx.Raw(`SELECT (SELECT count(*) FROM ` + s.shardsTable() + `) AS shards, (SELECT count(*) FROM ` + s.relayTable() + `) AS relay,
			(SELECT COALESCE(max(shard), -1) FROM ` + s.shardsTable() + `) AS top`).Scan(&have).Error; err != nil {
			return fmt.Errorf("postgres: count shards of %s: %w", s.parent(), err)
		}
		if have.Shards != int64(s.shards) || have.Relay != int64(s.shards) || have.Top != int64(s.shards-1) {
			return fmt.Errorf("%w: outbox table %s has %d shards (%d relay rows), the store is configured with %d; changing it would move keys to other shards and break their order",
				storage.ErrInvalidConfig, s.parent(), have.Shards, have.Relay, s.shards)
		}
		return nil
	}, readCommitted)
}

// MigrationSQL returns Migrate's statements, followed by the partitions of
// the days Today through PrepareThrough. The source id is made by the
// database when the statements run (an md5 of random() and the clock: 32
// hex digits, on every PostgreSQL version).
func (s *OutboxStore) MigrationSQL(plan storage.MaintenancePlan) ([]string, error) {
	if plan.PrepareThrough.Before(plan.Today) {
		return nil, fmt.Errorf("%w: plan prepares through %s, before %s", storage.ErrInvalidConfig, dayText(plan.PrepareThrough), dayText(plan.Today))
	}
	stmts := append([]string{`CREATE SCHEMA IF NOT EXISTS ` + quoteIdent(s.tbl.schema)}, s.createStatements()...)
	stmts = append(stmts, s.sourceRow(`md5(random()::text || clock_timestamp()::text)`))
	for d := storage.DayOf(plan.Today); !d.After(plan.PrepareThrough); d = d.AddDate(0, 0, 1) {
		stmts = append(stmts, `CREATE TABLE IF NOT EXISTS `+s.tbl.qualified(partitionName(s.tbl.table, d))+` PARTITION OF `+s.parent()+` `+bounds(d))
	}
	return stmts, nil
}

// Append takes the counter rows of the rows' shards in ascending order
// (their row locks order the shard's transactions until tx ends), and
// inserts the rows. When a shard it appends to had nothing unpublished, it
// notifies Channel (storage.Notifier).
func (s *OutboxStore) Append(ctx context.Context, tx *gorm.DB, rows []storage.OutboxRow) error {
	tx = tx.WithContext(ctx)
	counts := storage.AssignShards(rows, s.shards)
	if len(counts) == 1 && len(rows) <= maxOneStatementRows {
		return s.appendOneShard(tx, counts[0], rows)
	}
	first := map[int32]int64{}
	notify := false
	for _, c := range counts {
		var got struct {
			NextSeq          int64
			PublishedThrough *int64
		}
		err := tx.Raw(`UPDATE `+s.shardsTable()+` c SET next_seq = c.next_seq + ? WHERE c.shard = ?
			RETURNING c.next_seq, (SELECT r.published_through FROM `+s.relayTable()+` r WHERE r.shard = c.shard) AS published_through`,
			c.Rows, c.Shard).Scan(&got).Error
		if err != nil {
			return fmt.Errorf("postgres: number rows of shard %d of %s: %w", c.Shard, s.parent(), err)
		}
		last := got.NextSeq
		if last < c.Rows {
			return fmt.Errorf("postgres: shard %d of %s has no counter row; run Migrate", c.Shard, s.parent())
		}
		first[c.Shard] = last - c.Rows + 1
		// Only a shard with nothing unpublished may have an idle relay;
		// one with a backlog has a relay at work, which polls again soon
		// after a cycle that published.
		notify = notify || got.PublishedThrough == nil || last-c.Rows <= *got.PublishedThrough
	}
	if notify {
		// PostgreSQL delivers it at commit, once per transaction (identical
		// ones are folded), and never after a rollback. Its commit takes a
		// lock that serializes notifying commits: hence only when needed.
		if err := tx.Exec(`SELECT pg_notify(?, '')`, s.Channel()).Error; err != nil {
			return fmt.Errorf("postgres: notify the relays of %s: %w", s.parent(), err)
		}
	}
	storage.NumberRows(rows, first)
	const perRow = 8
	for lo := 0; lo < len(rows); lo += 65535 / perRow {
		hi := min(lo+65535/perRow, len(rows))
		var b strings.Builder
		b.WriteString(`INSERT INTO ` + s.parent() + ` (shard, seq, day, event_id, topic, msg_key, msg_value, headers) VALUES `)
		args := make([]any, 0, perRow*(hi-lo))
		for i, r := range rows[lo:hi] {
			if i > 0 {
				b.WriteString(", ")
			}
			// The first value is never a []byte: GORM would expand it.
			b.WriteString("(?, ?, ?::date, ?, ?, ?, ?, ?)")
			args = append(args, r.Shard, r.Seq, dayText(r.Day), r.EventID, r.Topic, r.Key, r.Value, r.Headers)
		}
		if err := tx.Exec(b.String(), args...).Error; err != nil {
			return fmt.Errorf("postgres: insert into %s: %w", s.parent(), err)
		}
	}
	return nil
}

// maxOneStatementRows is the most rows appendOneShard writes: 7 parameters
// a row and 5 more stay within PostgreSQL's 65,535.
const maxOneStatementRows = (65535 - 5) / 7

// appendOneShard is Append for rows that all go to one shard, in one
// statement: the enqueuer's transaction waits for one round trip instead of
// two or three, and the database parses and plans one statement. The
// counter's UPDATE and the INSERT are data-modifying CTEs of that statement;
// the INSERT numbers the rows from what the UPDATE returns, so the row lock
// orders the shard's transactions exactly as in the general path. No row
// comes back when the shard has no counter row, and then nothing was
// inserted either.
func (s *OutboxStore) appendOneShard(tx *gorm.DB, c storage.ShardCount, rows []storage.OutboxRow) error {
	var b strings.Builder
	b.WriteString(`WITH c AS (UPDATE ` + s.shardsTable() + ` c SET next_seq = c.next_seq + ? WHERE c.shard = ?
		RETURNING c.next_seq, (SELECT r.published_through FROM ` + s.relayTable() + ` r WHERE r.shard = c.shard) AS published_through),
	ins AS (INSERT INTO ` + s.parent() + ` (shard, seq, day, event_id, topic, msg_key, msg_value, headers)
		SELECT ?::integer, c.next_seq - ? + v.ord, v.day, v.event_id, v.topic, v.msg_key, v.msg_value, v.headers
		FROM c, (VALUES `)
	args := make([]any, 0, 5+7*len(rows))
	args = append(args, c.Rows, c.Shard, c.Shard, c.Rows)
	for i, r := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?::bigint, ?::date, ?::text, ?::text, ?::bytea, ?::bytea, ?::bytea)")
		args = append(args, i+1, dayText(r.Day), r.EventID, r.Topic, r.Key, r.Value, r.Headers)
	}
	// Only a shard with nothing unpublished may have an idle relay; one
	// with a backlog has a relay at work, which polls again soon after a
	// cycle that published. PostgreSQL delivers the notification at
	// commit, once per transaction (identical ones are folded), and never
	// after a rollback; its commit takes a lock that serializes notifying
	// commits: hence only when needed. CASE calls pg_notify only then.
	b.WriteString(`) AS v (ord, day, event_id, topic, msg_key, msg_value, headers))
	SELECT c.next_seq, (CASE WHEN c.published_through IS NULL OR c.next_seq - ? <= c.published_through THEN pg_notify(?, '') END) IS NOT NULL AS notified FROM c`)
	args = append(args, c.Rows, s.Channel())
	// notified is selected for its CASE, which notifies; nobody reads it.
	var got []struct{ NextSeq int64 }
	if err := tx.Raw(b.String(), args...).Scan(&got).Error; err != nil {
		return fmt.Errorf("postgres: append to shard %d of %s: %w", c.Shard, s.parent(), err)
	}
	if len(got) != 1 || got[0].NextSeq < c.Rows {
		return fmt.Errorf("postgres: shard %d of %s has no counter row; run Migrate", c.Shard, s.parent())
	}
	storage.NumberRows(rows, map[int32]int64{c.Shard: got[0].NextSeq - c.Rows + 1})
	return nil
}

type leasedShard struct {
	Shard            int32
	PublishedThrough int64
	NextSeq          int64 // the last number committed when the lease was taken
}

type storedOutboxRow struct {
	Shard    int32
	Seq      int64
	Day      string
	EventID  string
	Topic    string
	MsgKey   []byte
	MsgValue []byte
	Headers  []byte
}

// leasedRow is a row of the claim's statement: a leased shard, and one of
// its rows (nil fields: none read), with the source row when asked for.
type leasedRow struct {
	LeaseShard       int32
	PublishedThrough int64
	NextSeq          int64
	Fits             bool
	Source           *string
	Epoch            *int64
	Shard            *int32
	Seq              *int64
	Day              *string
	EventID          *string
	Topic            *string
	MsgKey           []byte
	MsgValue         []byte
	Headers          []byte
}

// Claim leases shards with one UPDATE whose candidate rows are locked with
// SKIP LOCKED (a relay never waits for another). In the same statement it
// reads the leased shards' rows, one index range scan per shard, when
// their unpublished rows number no more than req.MaxRows; otherwise a
// second statement reads each shard's share of them.
func (s *OutboxStore) Claim(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, error) {
	rows, _, _, err := s.claim(ctx, db, req, false)
	return rows, err
}

// ClaimSource claims as Claim does and reads the source row in the same
// statement, from the snapshot the lease's statement began with
// (storage.SourceClaimer).
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
		sourceCols = ", src.source, src.epoch"
		sourceJoin = " LEFT JOIN " + s.sourceTable() + " src ON src.id = 1"
	}
	// The counters say how many committed rows each shard holds beyond its
	// mark (the rows and the counter commit together, and the statement
	// reads both in one snapshot), so each shard is read for exactly its
	// rows: none is read only to be cut off by a LIMIT.
	var got []leasedRow
	err := db.Raw(`WITH pick AS (
			SELECT r.shard, c.next_seq FROM `+s.relayTable()+` r JOIN `+s.shardsTable()+` c ON c.shard = r.shard
			 WHERE c.next_seq > r.published_through AND (r.owner = ? OR r.lease_until < clock_timestamp())
			 ORDER BY r.shard LIMIT ?
			   FOR UPDATE OF r SKIP LOCKED),
		leased AS (
			UPDATE `+s.relayTable()+` r SET owner = ?, lease_until = clock_timestamp() + make_interval(secs => ?)
			  FROM pick WHERE r.shard = pick.shard
			RETURNING r.shard, r.published_through, pick.next_seq),
		whole AS (SELECT coalesce(sum(next_seq - published_through), 0) <= ? AS fits FROM leased)
		SELECT l.shard AS lease_shard, l.published_through, l.next_seq, whole.fits`+sourceCols+`,
		       o.shard, o.seq, to_char(o.day, 'YYYY-MM-DD') AS day, o.event_id, o.topic, o.msg_key, o.msg_value, o.headers
		  FROM leased l CROSS JOIN whole`+sourceJoin+`
		  LEFT JOIN LATERAL (SELECT * FROM `+s.parent()+` x
		     WHERE whole.fits AND x.shard = l.shard AND x.seq > l.published_through
		     ORDER BY x.seq LIMIT l.next_seq - l.published_through) o ON true
		 ORDER BY l.shard, o.seq`,
		req.Relay, maxShards, req.Relay, req.Lease.Seconds(), req.MaxRows).Scan(&got).Error
	if err != nil {
		return nil, "", 0, fmt.Errorf("postgres: lease shards of %s: %w", s.parent(), err)
	}
	if len(got) == 0 {
		return nil, "", 0, nil
	}
	var source string
	var epoch int64
	if withSource {
		if got[0].Source == nil || got[0].Epoch == nil {
			return nil, "", 0, fmt.Errorf("postgres: %s has no source row; run Migrate", s.sourceTable())
		}
		source, epoch = *got[0].Source, *got[0].Epoch
	}
	if got[0].Fits {
		rows := make([]storage.OutboxRow, 0, len(got))
		for _, g := range got {
			if g.Shard == nil || g.Seq == nil || g.Day == nil || g.EventID == nil || g.Topic == nil {
				continue
			}
			day, err := time.Parse(time.DateOnly, *g.Day)
			if err != nil {
				return nil, "", 0, fmt.Errorf("postgres: malformed day %q: %w", *g.Day, err)
			}
			rows = append(rows, storage.OutboxRow{Shard: *g.Shard, Seq: *g.Seq, Day: day, EventID: *g.EventID, Topic: *g.Topic, Key: g.MsgKey, Value: g.MsgValue, Headers: g.Headers})
		}
		return rows, source, epoch, nil
	}
	leased := make([]leasedShard, 0, len(got))
	for _, g := range got {
		if len(leased) == 0 || leased[len(leased)-1].Shard != g.LeaseShard {
			leased = append(leased, leasedShard{Shard: g.LeaseShard, PublishedThrough: g.PublishedThrough, NextSeq: g.NextSeq})
		}
	}
	rows, err := s.readLeased(db, leased, req.MaxRows)
	return rows, source, epoch, err
}

// readLeased reads each leased shard's share of maxRows of its oldest
// unpublished rows.
func (s *OutboxStore) readLeased(db *gorm.DB, got []leasedShard, maxRows int) ([]storage.OutboxRow, error) {
	slices.SortFunc(got, func(a, b leasedShard) int { return cmp.Compare(a.Shard, b.Shard) })
	pending := make([]storage.ShardCount, len(got))
	through := make(map[int32]int64, len(got))
	for i, l := range got {
		pending[i] = storage.ShardCount{Shard: l.Shard, Rows: l.NextSeq - l.PublishedThrough}
		through[l.Shard] = l.PublishedThrough
	}
	shares := storage.ShareRows(pending, maxRows)
	if len(shares) == 0 {
		return nil, nil
	}
	var values strings.Builder
	for i, sh := range shares {
		if i > 0 {
			values.WriteString(", ")
		}
		fmt.Fprintf(&values, "(%d, %d::bigint, %d::bigint)", sh.Shard, through[sh.Shard], sh.Rows)
	}
	var stored []storedOutboxRow
	err := db.Raw(`SELECT o.shard, o.seq, to_char(o.day, 'YYYY-MM-DD') AS day, o.event_id, o.topic, o.msg_key, o.msg_value, o.headers
		  FROM (VALUES ` + values.String() + `) AS l(shard, through, take)
		  CROSS JOIN LATERAL (SELECT * FROM ` + s.parent() + ` x WHERE x.shard = l.shard AND x.seq > l.through ORDER BY x.seq LIMIT l.take) o
		 ORDER BY o.shard, o.seq`).Scan(&stored).Error
	if err != nil {
		return nil, fmt.Errorf("postgres: read leased shards of %s: %w", s.parent(), err)
	}
	rows := make([]storage.OutboxRow, len(stored))
	for i, p := range stored {
		day, err := time.Parse(time.DateOnly, p.Day)
		if err != nil {
			return nil, fmt.Errorf("postgres: malformed day %q: %w", p.Day, err)
		}
		rows[i] = storage.OutboxRow{Shard: p.Shard, Seq: p.Seq, Day: day, EventID: p.EventID, Topic: p.Topic, Key: p.MsgKey, Value: p.MsgValue, Headers: p.Headers}
	}
	return rows, nil
}

// Ack moves the marks of the shards relay holds, with one UPDATE.
func (s *OutboxStore) Ack(ctx context.Context, db *gorm.DB, relay string, marks []storage.Mark) error {
	if len(marks) == 0 {
		return nil
	}
	var values strings.Builder
	args := make([]any, 0, len(marks)+1)
	for i, m := range marks {
		if i > 0 {
			values.WriteString(", ")
		}
		fmt.Fprintf(&values, "(%d, %d::bigint, %d::bigint, %d::bigint, ?::text)", m.Shard, m.Seq, m.Offset, m.Epoch)
		args = append(args, m.EventID)
	}
	args = append(args, relay)
	// A mark naming its event moves only over that event's row: a database
	// that went back under the relay holds another one there, or none.
	var done []int32
	err := db.WithContext(ctx).Raw(`UPDATE `+s.relayTable()+` r SET published_through = GREATEST(r.published_through, v.through),
		       published_offset = CASE WHEN v.through > r.published_through THEN v.off ELSE r.published_offset END,
		       published_epoch = CASE WHEN v.through > r.published_through THEN v.epoch ELSE r.published_epoch END
		  FROM (VALUES `+values.String()+`) AS v(shard, through, off, epoch, event_id)
		 WHERE r.shard = v.shard AND r.owner = ?
		   AND (v.event_id = '' OR EXISTS (SELECT 1 FROM `+s.parent()+` o WHERE o.shard = v.shard AND o.seq = v.through AND o.event_id = v.event_id))
		RETURNING r.shard`, args...).Scan(&done).Error
	if err != nil {
		return fmt.Errorf("postgres: mark shards of %s published: %w", s.parent(), err)
	}
	if len(done) < len(marks) {
		var lost []int32
		for _, m := range marks {
			if !slices.Contains(done, m.Shard) {
				lost = append(lost, m.Shard)
			}
		}
		return fmt.Errorf("%w: shards %v of %s", storage.ErrLeaseLost, lost, s.parent())
	}
	return nil
}

// Marks reads the shards' marks and stored offsets.
func (s *OutboxStore) Marks(ctx context.Context, db *gorm.DB, shards []int32) ([]storage.Mark, error) {
	var got []storage.Mark
	if len(shards) > 0 {
		if err := db.WithContext(ctx).Raw(`SELECT shard, published_through AS seq, published_offset AS "offset", published_epoch AS epoch FROM `+s.relayTable()+` WHERE shard IN ?`, shards).Scan(&got).Error; err != nil {
			return nil, fmt.Errorf("postgres: read the marks of %s: %w", s.parent(), err)
		}
	}
	return storage.MarksInOrder(shards, got)
}

// Release ends relay's leases.
func (s *OutboxStore) Release(ctx context.Context, db *gorm.DB, relay string) error {
	if err := db.WithContext(ctx).Exec(`UPDATE `+s.relayTable()+` SET lease_until = '-infinity' WHERE owner = ?`, relay).Error; err != nil {
		return fmt.Errorf("postgres: release leases on %s: %w", s.parent(), err)
	}
	return nil
}

// IsRetryable is the inbox Store's classification (see Store.IsRetryable).
func (s *OutboxStore) IsRetryable(err error) bool { return isRetryable(err) }

// IsMissingTable is the inbox Store's classification (see
// Store.IsMissingTable).
func (s *OutboxStore) IsMissingTable(err error) bool { return isMissingTable(err) }

var _ storage.SourceClaimer = (*OutboxStore)(nil)

// Source returns the table's source id and epoch.
func (s *OutboxStore) Source(ctx context.Context, db *gorm.DB) (string, int64, error) {
	var got []struct {
		Source string
		Epoch  int64
	}
	if err := db.WithContext(ctx).Raw(`SELECT source, epoch FROM ` + s.sourceTable() + ` WHERE id = 1`).Scan(&got).Error; err != nil {
		return "", 0, fmt.Errorf("postgres: read the source of %s: %w", s.parent(), err)
	}
	if len(got) == 0 {
		return "", 0, fmt.Errorf("postgres: %s has no source row; run Migrate", s.sourceTable())
	}
	return got[0].Source, got[0].Epoch, nil
}

// Shards returns the store's shard count, OutboxOptions.Shards (or
// DefaultShards).
func (s *OutboxStore) Shards() int { return s.shards }

// BumpEpoch raises the table's epoch by one, with one UPDATE.
func (s *OutboxStore) BumpEpoch(ctx context.Context, db *gorm.DB) (int64, error) {
	var epochs []int64
	if err := db.WithContext(ctx).Raw(`UPDATE ` + s.sourceTable() + ` SET epoch = epoch + 1, epoch_at = now() WHERE id = 1 RETURNING epoch`).Scan(&epochs).Error; err != nil {
		return 0, fmt.Errorf("postgres: raise the epoch of %s: %w", s.parent(), err)
	}
	if len(epochs) == 0 {
		return 0, fmt.Errorf("postgres: %s has no source row; run Migrate", s.sourceTable())
	}
	return epochs[0], nil
}

// unpublishedIn is a query answering whether the relation rel holds a row
// beyond its shard's published mark: one index probe per shard.
func (s *OutboxStore) unpublishedIn(rel string) string {
	return `SELECT EXISTS (SELECT 1 FROM ` + s.relayTable() + ` r
		WHERE EXISTS (SELECT 1 FROM ` + rel + ` o WHERE o.shard = r.shard AND o.seq > r.published_through))`
}

// Maintain creates the partitions of the days from plan.Today through
// plan.PrepareThrough (a day whose rows already sit in the DEFAULT partition
// keeps them there), and drops the partitions of days before
// plan.ExpireBefore whose rows are all published; the others are reported
// in Held. Published rows of expired days in the DEFAULT partition are
// deleted.
func (s *OutboxStore) Maintain(ctx context.Context, db *gorm.DB, plan storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	db = db.WithContext(ctx)
	var report storage.MaintenanceReport
	existing, err := s.tbl.dayPartitions(db)
	if err != nil {
		return report, err
	}
	def := s.tbl.qualified(s.tbl.defaultPartition())
	expireBefore := storage.DayOf(plan.ExpireBefore)
	for d := storage.DayOf(plan.Today); !d.After(plan.PrepareThrough); d = d.AddDate(0, 0, 1) {
		if slices.ContainsFunc(existing, d.Equal) || d.Before(expireBefore) {
			continue
		}
		var inDefault bool
		if err := db.Raw(`SELECT EXISTS (SELECT 1 FROM `+def+` WHERE day = ?::date)`, dayText(d)).Scan(&inDefault).Error; err != nil {
			return report, fmt.Errorf("postgres: look for rows of %s in %s: %w", dayText(d), def, err)
		}
		if inDefault {
			continue // creating the partition would fail; the rows expire from DEFAULT
		}
		if !plan.DryRun {
			err := db.Transaction(func(tx *gorm.DB) error {
				if err := s.tbl.lock(tx); err != nil {
					return err
				}
				return tx.Exec(`CREATE TABLE IF NOT EXISTS ` + s.tbl.qualified(partitionName(s.tbl.table, d)) + ` PARTITION OF ` + s.parent() + ` ` + bounds(d)).Error
			}, readCommitted)
			if err != nil {
				return report, fmt.Errorf("postgres: create partition %s: %w", partitionName(s.tbl.table, d), err)
			}
		}
		report.Prepared = append(report.Prepared, d)
	}

	if !plan.DryRun {
		leftovers, err := s.tbl.detachedDays(db)
		if err != nil {
			return report, err
		}
		for _, d := range leftovers {
			if d.Before(expireBefore) {
				// Detached only after its rows were found published.
				if err := s.tbl.dropDetached(db, partitionName(s.tbl.table, d)); err != nil {
					return report, err
				}
			}
		}
	}
	slices.SortFunc(existing, time.Time.Compare)
	for _, d := range existing {
		if !d.Before(expireBefore) {
			continue
		}
		name := partitionName(s.tbl.table, d)
		held, dropped, err := s.expirePartition(db, name, plan.DryRun)
		if err != nil {
			return report, err
		}
		switch {
		case held:
			report.Held = append(report.Held, d)
		case dropped || plan.DryRun:
			report.Expired = append(report.Expired, d)
			report.RowsRemoved = -1
		}
	}

	// The DEFAULT partition: delete what is published, hold the rest.
	var heldDays []string
	if err := db.Raw(`SELECT DISTINCT to_char(o.day, 'YYYY-MM-DD') FROM `+def+` o JOIN `+s.relayTable()+` r ON r.shard = o.shard
		WHERE o.day < ?::date AND o.seq > r.published_through ORDER BY 1`, dayText(expireBefore)).Scan(&heldDays).Error; err != nil {
		return report, fmt.Errorf("postgres: look for unpublished expired rows in %s: %w", def, err)
	}
	held, err := parseDays(heldDays)
	if err != nil {
		return report, err
	}
	for _, d := range held {
		if !slices.ContainsFunc(report.Held, d.Equal) {
			report.Held = append(report.Held, d)
		}
	}
	published := ` FROM ` + def + ` o USING ` + s.relayTable() + ` r WHERE o.day < ?::date AND o.shard = r.shard AND o.seq <= r.published_through`
	var n int64
	if plan.DryRun {
		err = db.Raw(`SELECT count(*) FROM `+def+` o JOIN `+s.relayTable()+` r ON r.shard = o.shard WHERE o.day < ?::date AND o.seq <= r.published_through`,
			dayText(expireBefore)).Scan(&n).Error
	} else {
		res := db.Exec(`DELETE`+published, dayText(expireBefore))
		err, n = res.Error, res.RowsAffected
	}
	if err != nil {
		return report, fmt.Errorf("postgres: expire published rows from %s: %w", def, err)
	}
	if report.RowsRemoved >= 0 {
		report.RowsRemoved += n
	}
	slices.SortFunc(report.Held, time.Time.Compare)
	return report, nil
}

// expirePartition drops the partition name unless it holds an unpublished
// row. The check runs first without a lock (a held day costs inserts
// nothing), then again under the ACCESS EXCLUSIVE lock that detaching takes,
// so no row can arrive between the check and the detach. The detached table
// is dropped without that lock.
func (s *OutboxStore) expirePartition(db *gorm.DB, name string, dryRun bool) (held, dropped bool, err error) {
	rel := s.tbl.qualified(name)
	if err := db.Raw(s.unpublishedIn(rel)).Scan(&held).Error; err != nil {
		return false, false, fmt.Errorf("postgres: look for unpublished rows in %s: %w", name, err)
	}
	if held || dryRun {
		return held, false, nil
	}
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := s.tbl.lock(tx); err != nil {
			return err
		}
		if err := s.tbl.lockTable(tx); err != nil {
			return err
		}
		attached, err := s.tbl.isPartition(tx, name)
		if err != nil || !attached {
			return err
		}
		if err := tx.Raw(s.unpublishedIn(rel)).Scan(&held).Error; err != nil {
			return fmt.Errorf("postgres: look for unpublished rows in %s: %w", name, err)
		}
		if held {
			return nil
		}
		if err := tx.Exec(`ALTER TABLE ` + s.parent() + ` DETACH PARTITION ` + rel).Error; err != nil {
			return fmt.Errorf("postgres: detach partition %s: %w", name, err)
		}
		dropped = true
		return nil
	}, readCommitted)
	if err != nil || !dropped {
		return held, false, err
	}
	return false, true, s.tbl.dropDetached(db, name)
}

// Verify checks that the outbox tables exist with the configured number of
// shards and that the server's settings keep committed messages (fsync,
// full_page_writes, synchronous_commit): a message lost in a crash after
// its transaction committed is never published.
func (s *OutboxStore) Verify(ctx context.Context, db *gorm.DB) error {
	db = db.WithContext(ctx)
	problems, err := durabilityProblems(db)
	if err != nil {
		return err
	}
	var shards int64
	if err := db.Raw(`SELECT count(*) FROM ` + s.relayTable()).Scan(&shards).Error; err != nil {
		problems = append(problems, fmt.Errorf("outbox tables of %s are missing (run Migrate): %w", s.parent(), err))
	} else if shards != int64(s.shards) {
		problems = append(problems, fmt.Errorf("%s has %d shards, the store is configured with %d", s.parent(), shards, s.shards))
	}
	if len(problems) > 0 {
		return fmt.Errorf("postgres: unsafe outbox settings: %w", errors.Join(problems...))
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
	err := db.WithContext(ctx).Raw(`SELECT to_char(o.day, 'YYYY-MM-DD') AS day, count(*) AS rows,
		count(*) FILTER (WHERE o.seq > r.published_through) AS unpublished
		FROM ` + s.parent() + ` o JOIN ` + s.relayTable() + ` r ON r.shard = o.shard GROUP BY o.day ORDER BY o.day`).Scan(&raw).Error
	if err != nil {
		return nil, fmt.Errorf("postgres: stats of %s: %w", s.parent(), err)
	}
	out := make([]storage.DayStats, 0, len(raw))
	for _, r := range raw {
		d, err := time.Parse(time.DateOnly, r.Day)
		if err != nil {
			return nil, fmt.Errorf("postgres: malformed day %q: %w", r.Day, err)
		}
		out = append(out, storage.DayStats{Day: d, Rows: r.Rows, Unpublished: r.Unpublished})
	}
	return out, nil
}

var (
	_ storage.OutboxStore   = (*OutboxStore)(nil)
	_ storage.StatsReporter = (*OutboxStore)(nil)
	_ storage.SchemaPrinter = (*OutboxStore)(nil)
	_ storage.Verifier      = (*OutboxStore)(nil)
	_ storage.Sequenced     = (*OutboxStore)(nil)
	_ storage.Sharded       = (*OutboxStore)(nil)
	_ storage.MarkReader    = (*OutboxStore)(nil)
)
