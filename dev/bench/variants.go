package bench

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/internal/watermark"
	"github.com/inboxgo/inbox/storage"
)

// ConsumerName is the inbox consumer (and dedup scope) of every benchmark
// event.
const ConsumerName = "bench"

var discardLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// Event is one benchmark event: reserve one unit of SKU.
type Event struct {
	Seq  int64 // 0-based position in the stream; the upsert's version is Seq+1
	ID   string
	SKU  int64
	Time time.Time
}

// mix64 is splitmix64's finaliser: ids spread over the key space like
// random (UUIDv4-like) ids, not appended at the right edge of the index.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// NewEvent returns event seq of the stream dated day (at a time of that
// day that depends on seq). Ids never collide with prefilled rows, whose ids
// end in "-p".
func NewEvent(seq int64, skus int, day time.Time) Event {
	return Event{
		Seq:  seq,
		ID:   fmt.Sprintf("%016x-e%d", mix64(uint64(seq)), seq),
		SKU:  int64(mix64(uint64(seq)^0x5bd1e995) % uint64(skus)),
		Time: day.Add(time.Duration(seq%86400) * time.Second),
	}
}

// Events returns n events dated today.
func Events(n, skus int) []Event {
	evs := make([]Event, n)
	day := Today()
	for i := range evs {
		evs[i] = NewEvent(int64(i), skus, day)
	}
	return evs
}

// Message is the inbox message of e.
func (e Event) Message() inbox.Message {
	return inbox.Message{Consumer: ConsumerName, ID: e.ID, Time: e.Time, Topic: "bench", Offset: e.Seq}
}

// Variant is one way of applying the events' effect.
type Variant struct {
	Key  string // "a", "b", ... as in docs/BENCHMARKS.md
	Name string
	// Batched: one operation applies a batch of events (latency is per batch).
	Batched bool
	// Dedup: a replay of the same events applies nothing.
	Dedup bool
	// Idempotent: the effect is a set-to-state, not an increment.
	Idempotent bool
	// Untracked: run without the inbox's statement-tracking GORM callbacks
	// (txn.TrackStatements), to measure what that defence costs.
	Untracked bool
	// apply applies evs in one operation and returns how many effects it
	// applied.
	apply func(ctx context.Context, f *Fixture, evs []Event) (int, error)
}

// Variants are the variants (a)-(e), in order, with (a*), the baseline
// batched like (c).
var Variants = []Variant{
	{Key: "a", Name: "effect only, no dedup (baseline)", apply: applyEffectOnly},
	{Key: "a*", Name: "effect only, no dedup, batched like (c): the ceiling of batching", Batched: true, apply: applyEffectBatch},
	{Key: "b", Name: "inbox, Process (1 tx per event)", Dedup: true, apply: applyProcess},
	{Key: "c", Name: "inbox, ProcessBatch", Batched: true, Dedup: true, apply: applyProcessBatch},
	{Key: "a2", Name: "effect only, no dedup, one set-based UPDATE per batch: the ceiling of (c2)", Batched: true, apply: applySetEffectBatch},
	{Key: "c2", Name: "inbox, ProcessBatchFunc: a batch handler with one set-based UPDATE", Batched: true, Dedup: true, apply: applyProcessBatchFunc},
	{Key: "d1", Name: "hand-rolled check-then-insert (SELECT, INSERT, effect in 1 tx)", Dedup: true, apply: applyCheckThenInsert},
	{Key: "d2", Name: "hand-rolled, dedup row in a separate tx (not atomic)", Dedup: true, apply: applySeparateTx},
	{Key: "e", Name: "naturally idempotent upsert, no inbox row", Dedup: true, Idempotent: true, apply: applyUpsert},
}

// TrackingCost pairs (b) with (b) run without the inbox's statement
// tracking: the GORM callbacks that refuse a handler's statements after a
// transient statement error (a MariaDB deadlock, after which the session
// would autocommit) and tell a database failure from the handler's own.
var TrackingCost = []Variant{
	{Key: "b", Name: "inbox, Process (1 tx per event)", Dedup: true, apply: applyProcess},
	{Key: "b-untracked", Name: "inbox, Process, statement tracking removed", Dedup: true, Untracked: true, apply: applyProcess},
}

// VariantByKey returns the variant with key k, of Variants or Floor.
func VariantByKey(k string) (Variant, bool) {
	for _, v := range slices.Concat(Variants, Floor) {
		if v.Key == k {
			return v, true
		}
	}
	return Variant{}, false
}

// effect reserves one unit of e.SKU inside tx.
func (f *Fixture) effect(tx *gorm.DB, sku int64) error {
	res := tx.Exec(`UPDATE `+f.Stock+` SET reserved = reserved + 1 WHERE sku = ?`, sku)
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected != 1 {
		return fmt.Errorf("bench: sku %d: %d rows updated", sku, res.RowsAffected)
	}
	return nil
}

// setEffect reserves one unit per entry of skus inside tx, with one
// set-based UPDATE: the units are summed per sku, and the skus are listed
// in ascending order (a fixed lock order for concurrent batches).
func (f *Fixture) setEffect(tx *gorm.DB, skus []int64) error {
	q, args, want := f.setEffectSQL(skus)
	res := tx.Exec(q, args...)
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected != want {
		return fmt.Errorf("bench: set-based update of %d skus updated %d rows", want, res.RowsAffected)
	}
	return nil
}

// setEffectSQL is setEffect's statement with ? placeholders, its
// arguments, and the rows it must update.
func (f *Fixture) setEffectSQL(skus []int64) (string, []any, int64) {
	units := make(map[int64]int64, len(skus))
	for _, sku := range skus {
		units[sku]++
	}
	distinct := make([]int64, 0, len(units))
	for sku := range units {
		distinct = append(distinct, sku)
	}
	slices.Sort(distinct)
	args := make([]any, 0, 2*len(distinct))
	for _, sku := range distinct {
		args = append(args, sku, units[sku])
	}
	var q string
	switch f.Backend.Dialect {
	case Postgres:
		q = `UPDATE ` + f.Stock + ` AS s SET reserved = s.reserved + v.n FROM (VALUES ` +
			strings.TrimSuffix(strings.Repeat("(?::bigint, ?::bigint),", len(distinct)), ",") +
			`) AS v(sku, n) WHERE s.sku = v.sku`
	case MySQL:
		// A join with a derived table makes InnoDB scan and lock stock rows
		// beyond the batch's; CASE over the primary key locks only those.
		q = `UPDATE ` + f.Stock + ` SET reserved = reserved + CASE sku` +
			strings.Repeat(" WHEN ? THEN ?", len(distinct)) + ` END WHERE sku IN (` +
			strings.TrimSuffix(strings.Repeat("?,", len(distinct)), ",") + `)`
		for _, sku := range distinct {
			args = append(args, sku)
		}
	default:
		q = `UPDATE ` + f.Stock + ` SET reserved = reserved + v.column2 FROM (VALUES ` +
			strings.TrimSuffix(strings.Repeat("(?, ?),", len(distinct)), ",") +
			`) AS v WHERE ` + f.Stock + `.sku = v.column1`
	}
	return q, args, int64(len(distinct))
}

func (f *Fixture) batchHandler(ctx context.Context, tx *gorm.DB, msgs []inbox.Message) error {
	skus := make([]int64, len(msgs))
	for i, m := range msgs {
		skus[i] = NewEvent(m.Offset, f.SKUs, m.Time).SKU
	}
	return f.setEffect(tx, skus)
}

func (f *Fixture) handler(ctx context.Context, tx *gorm.DB, msg inbox.Message) error {
	// The sku travels in the offset's place in a real consumer; here it is
	// derived from the event again, as a handler would decode its payload.
	return f.effect(tx, NewEvent(msg.Offset, f.SKUs, msg.Time).SKU)
}

// withRetry runs fn again after the transient errors the inbox itself
// retries (by the same Store classification and the same backoff bounds),
// so the hand-rolled variants are not penalised by failures the inbox
// would have absorbed.
func (f *Fixture) withRetry(ctx context.Context, fn func() error) error {
	var err error
	for attempt := 1; attempt <= 10; attempt++ {
		if err = fn(); err == nil || !f.Store.IsRetryable(err) {
			return err
		}
		// The inbox's own wait between retries, with its default bounds.
		if werr := backoff.Sleep(ctx, backoff.Wait(inbox.DefaultMinBackoff, inbox.DefaultMaxBackoff, attempt)); werr != nil {
			return errors.Join(err, werr)
		}
	}
	return err
}

func (f *Fixture) tx(ctx context.Context, fn func(tx *gorm.DB) error) error {
	return f.withRetry(ctx, func() error { return f.Backend.DB.WithContext(ctx).Transaction(fn) })
}

func applyEffectOnly(ctx context.Context, f *Fixture, evs []Event) (int, error) {
	e := evs[0]
	return 1, f.tx(ctx, func(tx *gorm.DB) error { return f.effect(tx, e.SKU) })
}

func applyEffectBatch(ctx context.Context, f *Fixture, evs []Event) (int, error) {
	return len(evs), f.tx(ctx, func(tx *gorm.DB) error {
		for _, e := range evs {
			if err := f.effect(tx, e.SKU); err != nil {
				return err
			}
		}
		return nil
	})
}

func applyProcess(ctx context.Context, f *Fixture, evs []Event) (int, error) {
	out, err := f.Inbox.Process(ctx, evs[0].Message(), f.handler)
	if err != nil {
		return 0, err
	}
	if out == inbox.Processed {
		return 1, nil
	}
	return 0, nil
}

func applyProcessBatch(ctx context.Context, f *Fixture, evs []Event) (int, error) {
	return applied(evs)(f.Inbox.ProcessBatch(ctx, messages(evs), f.handler))
}

func messages(evs []Event) []inbox.Message {
	msgs := make([]inbox.Message, len(evs))
	for i, e := range evs {
		msgs[i] = e.Message()
	}
	return msgs
}

// applied counts the Processed results of a batch of evs, and fails on the
// first Failed one.
func applied(evs []Event) func(results []inbox.Result, err error) (int, error) {
	return func(results []inbox.Result, err error) (int, error) {
		if err != nil {
			return 0, err
		}
		n := 0
		for i, r := range results {
			switch r.Outcome {
			case inbox.Processed:
				n++
			case inbox.Failed:
				return n, fmt.Errorf("event %s: %w", evs[i].ID, r.Err)
			}
		}
		return n, nil
	}
}

func applySetEffectBatch(ctx context.Context, f *Fixture, evs []Event) (int, error) {
	skus := make([]int64, len(evs))
	for i, e := range evs {
		skus[i] = e.SKU
	}
	return len(evs), f.tx(ctx, func(tx *gorm.DB) error { return f.setEffect(tx, skus) })
}

func applyProcessBatchFunc(ctx context.Context, f *Fixture, evs []Event) (int, error) {
	return applied(evs)(f.Inbox.ProcessBatchFunc(ctx, messages(evs), f.batchHandler))
}

func (f *Fixture) seen(tx *gorm.DB, e Event) (bool, error) {
	var n int64
	err := tx.Raw(`SELECT COUNT(*) FROM `+f.Dedup+` WHERE consumer = ? AND event_id = ?`, ConsumerName, e.ID).Scan(&n).Error
	return n > 0, err
}

func (f *Fixture) insertDedup(tx *gorm.DB, e Event) error {
	return tx.Exec(`INSERT INTO `+f.Dedup+` (consumer, event_id, processed_at) VALUES (?, ?, ?)`, ConsumerName, e.ID, time.Now().UTC()).Error
}

// applyCheckThenInsert is the common hand-rolled dedup: look the id up,
// insert it, apply the effect, all in one transaction. (Concurrent
// deliveries of one id make the loser fail with a unique violation rather
// than see a duplicate; the benchmark has none.)
func applyCheckThenInsert(ctx context.Context, f *Fixture, evs []Event) (int, error) {
	e := evs[0]
	applied := 0
	err := f.tx(ctx, func(tx *gorm.DB) error {
		applied = 0
		dup, err := f.seen(tx, e)
		if err != nil || dup {
			return err
		}
		if err := f.insertDedup(tx, e); err != nil {
			return err
		}
		applied = 1
		return f.effect(tx, e.SKU)
	})
	return applied, err
}

// applySeparateTx checks the id, applies the effect in one transaction and
// records the id in another: a crash between the two commits applies the
// effect again on redelivery.
func applySeparateTx(ctx context.Context, f *Fixture, evs []Event) (int, error) {
	e := evs[0]
	db := f.Backend.DB.WithContext(ctx)
	dup, err := f.seen(db, e)
	if err != nil || dup {
		return 0, err
	}
	if err := f.tx(ctx, func(tx *gorm.DB) error { return f.effect(tx, e.SKU) }); err != nil {
		return 0, err
	}
	return 1, f.tx(ctx, func(tx *gorm.DB) error { return f.insertDedup(tx, e) })
}

// applyUpsert sets the sku's level to the event's state unless a newer
// version is already stored: the same however often it runs.
func applyUpsert(ctx context.Context, f *Fixture, evs []Event) (int, error) {
	e := evs[0]
	var q string
	switch f.Backend.Dialect {
	case MySQL:
		// Assignments run left to right: qty must read the old version.
		q = `INSERT INTO ` + f.Level + ` (sku, qty, version) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE
			qty = IF(VALUES(version) > version, VALUES(qty), qty), version = GREATEST(version, VALUES(version))`
	default:
		q = `INSERT INTO ` + f.Level + ` (sku, qty, version) VALUES (?, ?, ?) ON CONFLICT (sku) DO UPDATE
			SET qty = excluded.qty, version = excluded.version WHERE ` + f.Level + `.version < excluded.version`
	}
	applied := 0
	err := f.tx(ctx, func(tx *gorm.DB) error {
		res := tx.Exec(q, e.SKU, e.Seq%1000, e.Seq+1)
		if res.Error != nil {
			return res.Error
		}
		applied = 0
		if res.RowsAffected > 0 {
			applied = 1
		}
		return nil
	})
	return applied, err
}

// Floor pairs the bare effect and the inbox's claim plus the effect, both
// written as raw SQL on database/sql (pgx itself on PostgreSQL), without
// GORM or the inbox, with the round trips Process makes on each database:
// what the database and the driver cost, the floor of (b)/(a). (s0) and
// (s20) are the same for sequenced dedup: the compare-and-set write of a
// watermark row per stream (one per worker) instead of the inbox rows,
// with BEGIN as rawTx sends it. (b0-begin) is (b0) with BEGIN a round trip
// of its own on MariaDB too: the inbox's path where the mysql Store cannot
// use connections of its own. (n0) sends a no-op SELECT 1 where (b0) and
// (s0) send their dedup write: the floor of any second statement per
// transaction, whatever it does.
var Floor = []Variant{
	{Key: "a0", Name: "effect only, raw SQL (BEGIN, UPDATE, COMMIT)", apply: applyRawEffect},
	{Key: "b0", Name: "inbox row and effect, raw SQL with Process's round trips", Dedup: true, apply: applyRawClaim},
	{Key: "b0-begin", Name: "inbox row and effect, raw SQL, BEGIN a round trip of its own (MariaDB: the path without the Store's connections)", Dedup: true, apply: applyRawClaimBegin},
	{Key: "a20", Name: "set-based effect per batch, raw SQL (BEGIN, UPDATE, COMMIT)", Batched: true, apply: applyRawSetEffect},
	{Key: "c20", Name: "inbox rows of a batch and set-based effect, raw SQL with ProcessBatchFunc's round trips", Batched: true, Dedup: true, apply: applyRawBatchClaim},
	{Key: "n0", Name: "effect with a no-op SELECT 1 where the dedup write goes, raw SQL with Process's round trips", apply: applyRawNoop},
	{Key: "s0", Name: "watermark of the event's stream and the effect, raw SQL with sequenced dedup's round trips", Dedup: true, apply: applyRawWatermark},
	{Key: "s20", Name: "watermark of a batch's stream and set-based effect, raw SQL with sequenced dedup's round trips", Batched: true, Dedup: true, apply: applyRawWatermark},
}

// rawTx runs fn in a transaction on one connection without GORM, with the
// round trips of the adapters' own transactions: on PostgreSQL through
// pgx, with BEGIN and first (if any) in one pipeline; on MariaDB, when
// there is a first statement, on a connection with autocommit off where
// first opens the transaction (as the mysql Store's own connections do);
// elsewhere through database/sql, one round trip per statement.
// Transient failures are retried as the other variants retry them.
func (f *Fixture) rawTx(ctx context.Context, first *rawStmt, fn func(firstN int64, exec rawExec) error) error {
	return f.rawTxBegin(ctx, first, f.Backend.Dialect == MySQL && first != nil, fn)
}

// rawTxBegin is rawTx with BEGIN a statement of its own on MariaDB unless
// autocommitOff.
func (f *Fixture) rawTxBegin(ctx context.Context, first *rawStmt, autocommitOff bool, fn func(firstN int64, exec rawExec) error) error {
	sqlDB, err := f.Backend.DB.DB()
	if err != nil {
		return err
	}
	return f.withRetry(ctx, func() error {
		if f.Backend.Dialect == Postgres {
			return f.rawPgxTx(ctx, sqlDB, first, fn)
		}
		if autocommitOff {
			return f.rawAutocommitOffTx(ctx, first, fn)
		}
		tx, err := sqlDB.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		var firstN int64
		if first != nil {
			res, err := tx.ExecContext(ctx, first.sql, first.args...)
			if err != nil {
				return err
			}
			if firstN, err = res.RowsAffected(); err != nil {
				return err
			}
		}
		if err := fn(firstN, func(q string, args ...any) (int64, error) {
			res, err := tx.ExecContext(ctx, q, args...)
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		}); err != nil {
			return err
		}
		return tx.Commit()
	})
}

type rawStmt struct {
	sql  string
	args []any
}

// rawExec runs one statement and returns its affected-row count.
type rawExec func(q string, args ...any) (int64, error)

func (f *Fixture) rawPgxTx(ctx context.Context, sqlDB *sql.DB, first *rawStmt, fn func(firstN int64, exec rawExec) error) error {
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	return conn.Raw(func(dc any) error {
		pc := dc.(*stdlib.Conn).Conn()
		committed := false
		defer func() {
			if !committed {
				_, _ = pc.Exec(context.Background(), "ROLLBACK")
			}
		}()
		var firstN int64
		if first == nil {
			if _, err := pc.Exec(ctx, "BEGIN"); err != nil {
				return err
			}
		} else {
			var b pgx.Batch
			b.Queue("BEGIN")
			b.Queue(first.sql, first.args...)
			br := pc.SendBatch(ctx, &b)
			_, err := br.Exec()
			if err == nil {
				var ct pgconn.CommandTag
				ct, err = br.Exec()
				firstN = ct.RowsAffected()
			}
			if cerr := br.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
		if err := fn(firstN, func(q string, args ...any) (int64, error) {
			ct, err := pc.Exec(ctx, q, args...)
			return ct.RowsAffected(), err
		}); err != nil {
			return err
		}
		if _, err := pc.Exec(ctx, "COMMIT"); err != nil {
			return err
		}
		committed = true
		return nil
	})
}

// rawAutocommitOffTx runs first, fn's statements and COMMIT on a
// connection of the backend's pool with autocommit off (see
// Backend.autocommitOff), where first opens the transaction.
func (f *Fixture) rawAutocommitOffTx(ctx context.Context, first *rawStmt, fn func(firstN int64, exec rawExec) error) error {
	pool, err := f.Backend.autocommitOff()
	if err != nil {
		return err
	}
	conn, err := pool.Conn(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	committed := false
	defer func() {
		if !committed {
			if _, err := conn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
				_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			}
		}
	}()
	exec := func(q string, args ...any) (int64, error) {
		res, err := conn.ExecContext(ctx, q, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	firstN, err := exec(first.sql, first.args...)
	if err != nil {
		return err
	}
	if err := fn(firstN, exec); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return err
	}
	committed = true
	return nil
}

// autocommitOff returns the backend's second pool, opened on first use
// from the DSN of its GORM dialector with autocommit=0 (the driver sets
// it on every connection), of the same size as its own pool.
func (b *Backend) autocommitOff() (*sql.DB, error) {
	b.rawMu.Lock()
	defer b.rawMu.Unlock()
	if b.raw != nil {
		return b.raw, nil
	}
	d, ok := b.DB.Dialector.(*gormmysql.Dialector)
	if !ok || d.DSN == "" {
		return nil, fmt.Errorf("bench: %s has no DSN to open a pool with autocommit off from", b.Name)
	}
	cfg, err := gomysql.ParseDSN(d.DSN)
	if err != nil {
		return nil, err
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["autocommit"] = "0"
	connector, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	b.raw = sql.OpenDB(connector)
	b.raw.SetMaxOpenConns(b.PoolSize)
	b.raw.SetMaxIdleConns(b.PoolSize)
	return b.raw, nil
}

// rawEffect is the effect's UPDATE in the dialect's placeholders.
func (f *Fixture) rawEffect(exec rawExec, sku int64) error {
	q := `UPDATE ` + f.Stock + ` SET reserved = reserved + 1 WHERE sku = ?`
	if f.Backend.Dialect == Postgres {
		q = `UPDATE ` + f.Stock + ` SET reserved = reserved + 1 WHERE sku = $1`
	}
	n, err := exec(q, sku)
	if err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("bench: sku %d: %d rows updated", sku, n)
	}
	return nil
}

func applyRawEffect(ctx context.Context, f *Fixture, evs []Event) (int, error) {
	return 1, f.rawTx(ctx, nil, func(_ int64, exec rawExec) error { return f.rawEffect(exec, evs[0].SKU) })
}

func applyRawNoop(ctx context.Context, f *Fixture, evs []Event) (int, error) {
	return 1, f.rawTx(ctx, &rawStmt{sql: "SELECT 1"}, func(_ int64, exec rawExec) error { return f.rawEffect(exec, evs[0].SKU) })
}

// rawClaim is the single-row claim each adapter sends, on f's inbox table.
func (f *Fixture) rawClaim(e Event) *rawStmt {
	m := e.Message()
	day := storage.DayOf(m.Time)
	switch f.Backend.Dialect {
	case Postgres:
		return &rawStmt{`INSERT INTO ` + f.InboxTable + ` (consumer, event_id, day, event_time, topic, partition_no, offset_no) ` +
			`VALUES ($1, $2, $3::date, $4, $5, $6, $7) ON CONFLICT (consumer, event_id, day) DO NOTHING`,
			[]any{m.Consumer, m.ID, day.Format(time.DateOnly), m.Time.UTC(), m.Topic, m.Partition, m.Offset}}
	case MySQL:
		return &rawStmt{`INSERT INTO ` + f.InboxTable + ` (consumer, event_id, day, event_time, topic, partition_no, offset_no, claim_token, processed_at) ` +
			`VALUES (?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE deliveries = deliveries + 1`,
			[]any{[]byte(m.Consumer), []byte(m.ID), day.Format(time.DateOnly), m.Time.UTC().Format("2006-01-02 15:04:05.999999"),
				[]byte(m.Topic), m.Partition, m.Offset, int64(e.Seq)}}
	}
	return &rawStmt{`INSERT INTO ` + f.InboxTable + ` (consumer, event_id, day, event_time, topic, partition_no, offset_no) ` +
		`VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (consumer, event_id, day) DO NOTHING`,
		[]any{m.Consumer, m.ID, day.Format(time.DateOnly), m.Time.UTC().Format(time.RFC3339Nano), m.Topic, m.Partition, m.Offset}}
}

func applyRawClaim(ctx context.Context, f *Fixture, evs []Event) (int, error) {
	return f.rawClaimAndEffect(ctx, evs[0], f.Backend.Dialect == MySQL)
}

// applyRawClaimBegin is applyRawClaim with BEGIN a round trip of its own
// on MariaDB too.
func applyRawClaimBegin(ctx context.Context, f *Fixture, evs []Event) (int, error) {
	return f.rawClaimAndEffect(ctx, evs[0], false)
}

// rawClaimAndEffect claims e and applies its effect if the claim inserted
// the row (see rawTxBegin for autocommitOff).
func (f *Fixture) rawClaimAndEffect(ctx context.Context, e Event, autocommitOff bool) (int, error) {
	applied := 0
	err := f.rawTxBegin(ctx, f.rawClaim(e), autocommitOff, func(claimed int64, exec rawExec) error {
		applied = 0
		// 1 row affected: inserted; a duplicate affects 0 rows (2 with
		// MariaDB's ON DUPLICATE KEY UPDATE).
		if claimed != 1 {
			return nil
		}
		applied = 1
		return f.rawEffect(exec, e.SKU)
	})
	return applied, err
}

// placeholders numbers q's ? placeholders for PostgreSQL ($1, $2, ...).
func (f *Fixture) placeholders(q string) string {
	if f.Backend.Dialect != Postgres {
		return q
	}
	var b strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

func (f *Fixture) rawSetEffect(exec rawExec, evs []Event) error {
	skus := make([]int64, len(evs))
	for i, e := range evs {
		skus[i] = e.SKU
	}
	q, args, want := f.setEffectSQL(skus)
	n, err := exec(f.placeholders(q), args...)
	if err != nil {
		return err
	}
	if n != want {
		return fmt.Errorf("bench: set-based update of %d skus updated %d rows", want, n)
	}
	return nil
}

func applyRawSetEffect(ctx context.Context, f *Fixture, evs []Event) (int, error) {
	return len(evs), f.rawTx(ctx, nil, func(_ int64, exec rawExec) error { return f.rawSetEffect(exec, evs) })
}

// rawBatchClaim is the multi-row claim each adapter sends for evs (in key
// order, as the adapters sort them), with PostgreSQL's RETURNING; the
// affected-row count is read, the returned keys are not.
func (f *Fixture) rawBatchClaim(evs []Event) *rawStmt {
	sorted := slices.Clone(evs)
	slices.SortFunc(sorted, func(a, b Event) int { return strings.Compare(a.ID, b.ID) })
	cols := ` (consumer, event_id, day, event_time, topic, partition_no, offset_no) `
	if f.Backend.Dialect == Postgres {
		n := len(sorted)
		consumers, ids, days, topics := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		times, partitions, offsets := make([]time.Time, n), make([]int32, n), make([]int64, n)
		for i, e := range sorted {
			m := e.Message()
			consumers[i], ids[i], days[i], topics[i] = m.Consumer, m.ID, storage.DayOf(m.Time).Format(time.DateOnly), m.Topic
			times[i], partitions[i], offsets[i] = m.Time.UTC(), m.Partition, m.Offset
		}
		return &rawStmt{`INSERT INTO ` + f.InboxTable + cols +
			`SELECT * FROM unnest($1::text[], $2::text[], $3::date[], $4::timestamptz[], $5::text[], $6::integer[], $7::bigint[])` +
			` ON CONFLICT (consumer, event_id, day) DO NOTHING RETURNING consumer, event_id, to_char(day, 'YYYY-MM-DD')`,
			[]any{consumers, ids, days, times, topics, partitions, offsets}}
	}
	var b strings.Builder
	var args []any
	for i, e := range sorted {
		if i > 0 {
			b.WriteString(", ")
		}
		one := f.rawClaim(e)
		args = append(args, one.args...)
		if f.Backend.Dialect == MySQL {
			b.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6))")
		} else {
			b.WriteString("(?, ?, ?, ?, ?, ?, ?)")
		}
	}
	if f.Backend.Dialect == MySQL {
		return &rawStmt{`INSERT INTO ` + f.InboxTable + ` (consumer, event_id, day, event_time, topic, partition_no, offset_no, claim_token, processed_at) VALUES ` +
			b.String() + ` ON DUPLICATE KEY UPDATE deliveries = deliveries + 1`, args}
	}
	// Without the adapter's RETURNING: go-sqlite3's Exec steps a statement
	// once, so the count would stop at the first returned row. The floor is
	// then a little lower than the adapter's work.
	return &rawStmt{`INSERT INTO ` + f.InboxTable + cols + `VALUES ` + b.String() +
		` ON CONFLICT (consumer, event_id, day) DO NOTHING`, args}
}

func applyRawBatchClaim(ctx context.Context, f *Fixture, evs []Event) (int, error) {
	applied := 0
	err := f.rawTx(ctx, f.rawBatchClaim(evs), func(claimed int64, exec rawExec) error {
		applied = 0
		n := int64(len(evs))
		switch {
		case claimed == n:
		case claimed == 0 || (f.Backend.Dialect == MySQL && claimed == 2*n):
			return nil // a replay: every row was there
		default:
			return fmt.Errorf("bench: %d of %d rows claimed: the floor variant handles all-new and all-duplicate batches only", claimed, n)
		}
		applied = len(evs)
		return f.rawSetEffect(exec, evs)
	})
	return applied, err
}

// rawWatermarks is what applyRawWatermark knows of its streams' watermarks,
// as the consumer knows them: read once, then kept in memory.
type rawWatermarks struct {
	mu      sync.Mutex
	streams int             // one stream per worker (Apply sets it)
	applied map[int32]int64 // per stream, the Seq of the last event applied
}

// rawWatermark is the compare-and-set write of the watermark of the
// stream of evs (one per worker, like a partition) that the sequenced
// consumer sends with BEGIN, in the adapter's SQL: an INSERT for a stream
// without a row, otherwise an UPDATE ... WHERE applied = the old value. ok
// is false when evs were applied already (a replay): the consumer then runs
// no transaction at all.
func (f *Fixture) rawWatermark(evs []Event) (stmt *rawStmt, commit func(), ok bool) {
	f.wm.mu.Lock()
	defer f.wm.mu.Unlock()
	stream := int32(evs[0].SKU % int64(max(f.wm.streams, 1)))
	last := evs[len(evs)-1].Seq
	old, seen := f.wm.applied[stream]
	if seen && last <= old {
		return nil, nil, false
	}
	value := watermark.Encode(watermark.Applied{stream: last})
	const scope, source, epoch, topic = "bench", BenchSource, 1, "bench"
	commit = func() {
		f.wm.mu.Lock()
		defer f.wm.mu.Unlock()
		if f.wm.applied == nil {
			f.wm.applied = map[int32]int64{}
		}
		f.wm.applied[stream] = last
	}
	t := f.WatermarkTable
	if !seen {
		q := `INSERT INTO ` + t + ` (scope, source, epoch, topic, partition_no, applied) VALUES (?, ?, ?, ?, ?, ?)`
		switch f.Backend.Dialect {
		case Postgres:
			q = `INSERT INTO ` + t + ` (scope, source, epoch, topic, partition_no, applied) VALUES ($1, $2, $3, $4, $5, $6)`
		case MySQL:
			q = `INSERT INTO ` + t + ` (scope, source, epoch, topic, partition_no, applied, updated_at) VALUES (?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6))`
		}
		return &rawStmt{q, []any{scope, source, epoch, topic, stream, value}}, commit, true
	}
	q := `UPDATE ` + t + ` SET applied = ?, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
		WHERE scope = ? AND topic = ? AND partition_no = ? AND source = ? AND epoch = ? AND applied = ?`
	switch f.Backend.Dialect {
	case Postgres:
		q = `UPDATE ` + t + ` SET applied = $1, updated_at = now()
			WHERE scope = $2 AND topic = $3 AND partition_no = $4 AND source = $5 AND epoch = $6 AND applied = $7`
	case MySQL:
		q = `UPDATE ` + t + ` SET applied = ?, updated_at = UTC_TIMESTAMP(6)
			WHERE scope = ? AND topic = ? AND partition_no = ? AND source = ? AND epoch = ? AND applied = ?`
	}
	oldValue := watermark.Encode(watermark.Applied{stream: old})
	return &rawStmt{q, []any{value, scope, topic, stream, source, epoch, oldValue}}, commit, true
}

func applyRawWatermark(ctx context.Context, f *Fixture, evs []Event) (int, error) {
	stmt, commit, ok := f.rawWatermark(evs)
	if !ok {
		return 0, nil
	}
	err := f.rawTx(ctx, stmt, func(written int64, exec rawExec) error {
		if written != 1 {
			return fmt.Errorf("bench: the watermark write matched %d rows, want 1", written)
		}
		return f.rawSetEffect(exec, evs)
	})
	if err != nil {
		return 0, err
	}
	commit()
	return len(evs), nil
}
