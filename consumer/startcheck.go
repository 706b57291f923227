package consumer

// The checks Run makes before it joins the group: the configured topics
// exist, and the tables the configuration needs take the consumer's
// statements. Either mistake (a typo in a topic, a Migrate never run) would
// otherwise leave the consumer idle, or retrying a "database failure", for
// ever.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/storage"
)

var (
	// ErrUnknownTopic is wrapped by Run's error when a topic of
	// Config.Topics, or the Failure.DeadLetterTopic of the DeadLetter policy
	// (unless a Failure.DeadLetterWriter of your own publishes dead letters, maybe
	// to another cluster), does not exist on the cluster when Run starts
	// (or this client may not describe it). The consumer never creates
	// topics.
	ErrUnknownTopic = errors.New("consumer: unknown topic")
	// ErrNotMigrated is wrapped by Run's error when a table the
	// configuration needs (the inbox table; the offsets table with
	// Offsets.Store; the watermark table with Sequenced.Sources) is missing
	// or does not take the consumer's statements when Run starts. The error
	// names the Migrate call to run.
	ErrNotMigrated = errors.New("consumer: a table the configuration needs is not migrated")
)

// topicGrace is how long a configured topic may be missing from the
// cluster's metadata before Run gives up: a topic created just before Run
// may take a metadata refresh (transportMetadataTTL) to appear.
const topicGrace = 3 * time.Second

// checkTopics returns an error wrapping ErrUnknownTopic, naming every topic
// of Config.Topics the cluster does not know, and the dead-letter topic the
// consumer's own writer would publish to, once they were missing for
// topicGrace. While the cluster does not answer it retries, as Run does
// for every broker outage; nil if ctx ends first.
func (c *Consumer) checkTopics(ctx context.Context) error {
	topics := c.cfg.Topics
	dlq := c.cfg.Failure.Policy == DeadLetter && c.cfg.Failure.DeadLetterWriter == nil
	if dlq {
		topics = append(slices.Clip(topics), c.cfg.Failure.DeadLetterTopic)
	}
	var missingSince time.Time
	for attempt := 1; ; attempt++ {
		missing, err := c.client.MissingTopics(ctx, topics)
		if ctx.Err() != nil {
			return nil
		}
		wait := 250 * time.Millisecond
		switch {
		case err != nil:
			missingSince = time.Time{}
			wait = backoff.Wait(c.cfg.Failure.MinBackoff, c.cfg.Failure.MaxBackoff, attempt)
			c.log.Warn("cannot read the cluster's topics; retrying", "error", err, "attempt", attempt, "retry_in", wait)
		case len(missing) == 0:
			return nil
		case missingSince.IsZero():
			missingSince = time.Now()
		case time.Since(missingSince) >= topicGrace:
			names, which := quoteAll(missing), "each topic of Config.Topics"
			if dlq {
				which += " and the dead-letter topic"
				names = strings.Replace(names, fmt.Sprintf("%q", c.cfg.Failure.DeadLetterTopic),
					fmt.Sprintf("%q (Config.Failure.DeadLetterTopic)", c.cfg.Failure.DeadLetterTopic), 1)
			}
			return fmt.Errorf("%w: %s not on the cluster (or not visible to this client): create %s before Run, "+
				"with the partitions you need (the consumer never creates topics), or correct the name",
				ErrUnknownTopic, names, which)
		}
		if backoff.Sleep(ctx, wait) != nil {
			return nil
		}
	}
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}

// checkTables returns an error wrapping ErrNotMigrated, naming the Migrate
// call to run, if a table the configuration needs does not take the
// consumer's statements: a claim of the inbox table (in a transaction
// rolled back at once), a read of the offsets table (Offsets.Store) and of
// the watermark table (Sequenced.Sources). Only an answering database
// decides: while a probe fails with a transient error, or the database
// does not answer a ping, it retries, as Run does for every database
// outage; nil if ctx ends first.
//
// The server's settings (durability, SQL mode) are not checked here:
// inboxctl check reports them.
func (c *Consumer) checkTables(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := c.probeTables(ctx)
		if err == nil || errors.Is(err, ErrNotMigrated) {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		wait := backoff.Wait(c.cfg.Failure.MinBackoff, c.cfg.Failure.MaxBackoff, attempt)
		c.log.Warn("cannot check the consumer's tables, the database failed; retrying", "error", err, "attempt", attempt, "retry_in", wait)
		if backoff.Sleep(ctx, wait) != nil {
			return nil
		}
	}
}

// errProbeDone rolls the inbox probe's transaction back.
var errProbeDone = errors.New("consumer: start-up probe done")

// table is one table the configuration needs: what fails when it does not
// work, its name for log lines, the call that makes it, and a probe that
// fails if it does not take the consumer's statements.
type table struct {
	what, name, fix string
	probe           func(ctx context.Context, db *gorm.DB) error
}

// tables lists the tables the configuration needs.
func (c *Consumer) tables() []table {
	var ts []table
	if ib := c.cfg.Inbox; ib != nil {
		store := ib.Store()
		ts = append(ts, table{what: fmt.Sprintf("the inbox table of %T does not take a claim", store),
			name: cmp.Or(inboxTableName(store), fmt.Sprintf("the inbox table of %T", store)), fix: "run Inbox.Migrate (or inboxctl migrate)",
			probe: func(ctx context.Context, db *gorm.DB) error { return c.probeClaim(ctx, db, store) }})
	}
	if c.cfg.Offsets.Store {
		ts = append(ts, table{what: fmt.Sprintf("the offsets table %q (Config.Offsets.Store) cannot be read", c.cfg.Offsets.Table),
			name: c.cfg.Offsets.Table, fix: "run Consumer.Migrate",
			probe: func(ctx context.Context, db *gorm.DB) error {
				_, _, err := c.offsets.Read(ctx, db, c.cfg.Topics[0], 0)
				return err
			}})
	}
	if c.watermarks != nil {
		ts = append(ts, table{what: "the watermark table (Config.Sequenced.Sources) cannot be read",
			name: cmp.Or(watermarkTableName(c.watermarks), fmt.Sprintf("the watermark table of %T", c.watermarks)), fix: "run Consumer.Migrate (or inboxctl migrate)",
			probe: func(ctx context.Context, db *gorm.DB) error {
				_, err := c.watermarks.Watermarks(ctx, db, c.cfg.Consumer, c.cfg.Topics[0], 0)
				return err
			}})
	}
	return ts
}

// The names of a store's tables, as this module's adapters report them; ""
// for a store that does not.
type (
	tableNamer          interface{ Table() string }
	watermarkTableNamer interface{ WatermarkTable() string }
	schemaNamer         interface{ Schema() string }
)

// inSchema is name qualified by store's schema, if it has one; "" if name
// is.
func inSchema(store any, name string) string {
	if s, ok := store.(schemaNamer); ok && name != "" && s.Schema() != "" {
		return s.Schema() + "." + name
	}
	return name
}

func inboxTableName(store any) string {
	if n, ok := store.(tableNamer); ok {
		return inSchema(store, n.Table())
	}
	return ""
}

func watermarkTableName(store any) string {
	if n, ok := store.(watermarkTableNamer); ok {
		return inSchema(store, n.WatermarkTable())
	}
	return ""
}

// probeTables runs each table's probe once. An error wrapping
// ErrNotMigrated is a table that does not work while the database answers;
// any other error says nothing about the tables.
func (c *Consumer) probeTables(ctx context.Context) error {
	db := c.db() // quiet: the probes' failures stay out of the application's GORM logger
	for _, t := range c.tables() {
		if err := c.probe(ctx, db, t.probe); err != nil {
			return c.notMigrated(ctx, err, t.what, t.fix)
		}
	}
	return nil
}

// missingTables returns, when err is a database failure that the store
// reports as a missing table (storage.MissingTableReporter: one dropped
// while the consumer runs), log attributes that say so: each table of the
// configuration whose probe finds it missing, and the Migrate call that
// makes it. Nil for any other err. The failure is still retried: the table
// may come back.
func (c *Consumer) missingTables(ctx context.Context, err error) []any {
	mt, ok := c.cfg.Classifier.(storage.MissingTableReporter)
	if !ok && c.cfg.Inbox != nil {
		mt, ok = c.cfg.Inbox.Store().(storage.MissingTableReporter)
	}
	if !ok || err == nil || !mt.IsMissingTable(err) {
		return nil
	}
	if ctx.Err() != nil {
		return []any{"missing_table", "a table the statement names does not exist"}
	}
	var names, fixes []string
	for _, t := range c.tables() {
		if perr := c.probe(ctx, c.db(), t.probe); perr != nil && mt.IsMissingTable(perr) {
			names = append(names, t.name)
			if !slices.Contains(fixes, t.fix) {
				fixes = append(fixes, t.fix)
			}
		}
	}
	if len(names) == 0 {
		// Not a table of the consumer's: the handler's own, say.
		return []any{"missing_table", "a table the statement names does not exist"}
	}
	state := "the table does not exist (dropped?); retrying until it does"
	if len(names) > 1 {
		state = "the tables do not exist (dropped?); retrying until they do"
	}
	return []any{"missing_table", strings.Join(names, ", "), "fix", strings.Join(fixes, "; ") + ": " + state}
}

// probe runs fn within Timeouts.Database.
func (c *Consumer) probe(ctx context.Context, db *gorm.DB, fn func(ctx context.Context, db *gorm.DB) error) error {
	pctx, cancel := ctx, context.CancelFunc(func() {})
	if b := c.bound(); b > 0 {
		pctx, cancel = context.WithTimeout(ctx, b)
	}
	defer cancel()
	return fn(pctx, db.WithContext(pctx))
}

// probeClaim claims a row of today no message can have, in a transaction
// it rolls back. A claim that finds no storage for today's day found the
// table.
func (c *Consumer) probeClaim(ctx context.Context, db *gorm.DB, store storage.InboxStore) error {
	now := time.Now().UTC()
	row := storage.InboxRow{Consumer: c.cfg.Consumer, EventID: fmt.Sprintf("inbox-consumer-start-probe-%d", now.UnixNano()),
		Day: storage.DayOf(now), EventTime: now, Topic: c.cfg.Topics[0], Partition: 0, Offset: 0}
	err := db.Transaction(func(tx *gorm.DB) error {
		if _, err := store.Claim(ctx, tx, []storage.InboxRow{row}); err != nil {
			if dp, ok := store.(storage.DayPreparer); ok && dp.IsMissingDay(err) {
				return errProbeDone
			}
			return err
		}
		return errProbeDone
	})
	if errors.Is(err, errProbeDone) {
		return nil
	}
	return err
}

// notMigrated is err, a probe's failure, as an error wrapping
// ErrNotMigrated if the database answers and the failure is not transient;
// otherwise err as it is.
func (c *Consumer) notMigrated(ctx context.Context, err error, what, fix string) error {
	if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) ||
		(c.cfg.Classifier != nil && c.cfg.Classifier.IsRetryable(err)) || c.ping(ctx) != nil {
		return err
	}
	return fmt.Errorf("%w: %s: %s before Run: %w", ErrNotMigrated, what, fix, err)
}
