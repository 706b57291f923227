package storage

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"gorm.io/gorm"
)

// OutboxStore is the storage contract of the outbox: the part that differs
// between databases. An adapter implements it with its own dialect SQL;
// outbox.Outbox and outbox.Relay own validation, retries, logging and
// metrics, so an OutboxStore does none of those. The conformance package is the
// executable form of this contract.
//
// Rows live in shards: a row's shard is its KeyHash modulo the store's
// shard count, fixed when the table is created. Within a shard every row
// has a sequence number, and the OutboxStore keeps for each shard how far it has
// been published. An OutboxStore must be safe for concurrent use.
type OutboxStore interface {
	// Migrate creates the outbox tables (or checks existing ones) and the
	// shards. It must be idempotent and safe when several processes run it at
	// the same time, and must refuse a table made with another shard count:
	// moving keys to other shards would break their order.
	Migrate(ctx context.Context, db *gorm.DB) error

	// Append stores rows inside tx, the caller's transaction, setting each
	// row's Shard and Seq. Seq numbers of a shard are assigned in commit
	// order: Append holds a lock on each shard it writes to until tx ends
	// (taken in ascending shard order within one call), so of two
	// transactions appending to one shard, the second waits, and a row with
	// a lower Seq is always committed (or rolled back, its number then
	// reused) before a row with a higher one is. Rows of one shard within
	// one call get ascending Seq numbers in the order given. If tx rolls
	// back, nothing of the call remains.
	//
	// On a transient failure it returns an error for which IsRetryable is
	// true; it never retries by itself.
	Append(ctx context.Context, tx *gorm.DB, rows []OutboxRow) error

	// Claim leases to req.Relay, for req.Lease, the shards that hold
	// committed unpublished rows and on which no other relay holds a lease
	// that has not expired (its own leases are renewed), at most
	// req.MaxShards of them; it never waits for a shard another relay is
	// leasing at that moment (row locks that skip locked rows, or the
	// database's single writer). It then returns, in (Shard, Seq) order, at
	// most req.MaxRows of the oldest unpublished rows of the shards it
	// leased: for each shard a run of consecutive Seq numbers starting right
	// after the shard's published mark. Leases are timed by the database's
	// clock.
	Claim(ctx context.Context, db *gorm.DB, req ClaimRequest) ([]OutboxRow, error)

	// Ack moves the published mark of each shard in marks up to its Seq
	// (never down), storing the Mark's Offset and Epoch with a mark it moves
	// (a store that is a MarkReader), only where relay still holds the shard's lease (expired
	// or not, as long as no other relay took it) and, for a Mark with an
	// EventID, where the shard's row numbered Seq is that event. Other
	// shards are left alone, the others acknowledged, and the error wraps
	// ErrLeaseLost.
	Ack(ctx context.Context, db *gorm.DB, relay string, marks []Mark) error

	// Release ends relay's leases at once, so that other relays take its
	// shards over without waiting for the leases to expire.
	Release(ctx context.Context, db *gorm.DB, relay string) error

	// Maintain prepares storage for the days up to plan.PrepareThrough and
	// removes the published rows of days before plan.ExpireBefore. It never
	// removes an unpublished row: a day that still holds one is kept whole
	// (where days are partitions) and reported in Held. It must be
	// idempotent and safe while rows are appended, claimed and acknowledged.
	// With plan.DryRun it changes nothing and reports what it would do.
	Maintain(ctx context.Context, db *gorm.DB, plan MaintenancePlan) (MaintenanceReport, error)

	// IsRetryable reports whether err is a transient failure after which the
	// transaction can be run again, as the InboxStore of the same database
	// decides it.
	IsRetryable(err error) bool
}

// Sharded is an optional OutboxStore capability: the store's shard count.
// An aligned outbox (outbox.Config.AlignedTopic) needs it, since each shard
// is then a partition of one topic and the two counts must be equal.
type Sharded interface {
	// Shards returns the number of shards Migrate makes and checks: a
	// row's Shard is its KeyHash modulo it. It does not touch the database.
	Shards() int
}

// OutboxRow is one stored message.
type OutboxRow struct {
	Shard   int32 // set by Append: KeyHash modulo the store's shard count
	Seq     int64 // set by Append: the row's place in its shard, from 1
	KeyHash uint32
	// Day is the UTC day the row was enqueued on (by the enqueuer's clock);
	// it picks the partition. It is not the event time, which may lie in the
	// past: a row must never land in a day that expiry may be dropping.
	Day     time.Time
	EventID string
	Topic   string
	Key     []byte // nil: the message has no key
	Value   []byte
	Headers []byte // the encoded headers, opaque to the OutboxStore
}

// ClaimRequest is what a relay asks Claim for.
type ClaimRequest struct {
	Relay     string        // the relay's id
	Lease     time.Duration // how long the leases last, at least a millisecond
	MaxShards int           // at most this many shards; 0 for no limit
	MaxRows   int           // at most this many rows, at least 1
}

// Mark says that a shard is published through Seq.
type Mark struct {
	Shard int32
	Seq   int64
	// Offset is, for the shard's partition of an aligned outbox, an offset
	// at or before which no message of a row after Seq was published: where
	// a relay starts reading the partition to learn what was published
	// beyond the mark (MarkReader). Ack stores it with a mark it moves up,
	// and keeps the stored one with a mark it leaves. 0 means unknown: the
	// partition's start.
	Offset int64
	// Epoch is the epoch under which the row at Seq went out (the stream a
	// next row continues), stored and kept with Offset. 0 means unknown:
	// the store's current epoch.
	Epoch int64
	// EventID, if set, is the event id of the shard's row numbered Seq, the
	// last the relay published: Ack leaves the shard's mark alone if that
	// row is now another event or missing, as for a lost lease. The
	// producer's database went back under the relay (a restore, a failover
	// that lost commits) and hands that number out again; a mark moved
	// over it would count the new event published though no relay sent it.
	// Not stored.
	EventID string
}

// MarkReader is an optional OutboxStore capability that the relay of an
// aligned outbox needs while it stamps sequence headers (package outbox,
// "A producer database that goes back"): it reads the partition from a
// shard's stored Offset on to check that no number it is about to publish
// was published before for another event.
type MarkReader interface {
	// Marks returns the mark of each of shards, in the order given: the
	// shard's published Seq and the Offset and Epoch stored with it (0 if
	// Ack never stored them). A shard the store does not have is an error.
	Marks(ctx context.Context, db *gorm.DB, shards []int32) ([]Mark, error)
}

// MarksInOrder returns the marks of got in the order of shards, for a
// MarkReader: an error if a shard has no mark, or got one twice.
func MarksInOrder(shards []int32, got []Mark) ([]Mark, error) {
	byShard := make(map[int32]Mark, len(got))
	for _, m := range got {
		if _, twice := byShard[m.Shard]; twice {
			return nil, fmt.Errorf("storage: shard %d has two marks", m.Shard)
		}
		byShard[m.Shard] = m
	}
	out := make([]Mark, len(shards))
	for i, sh := range shards {
		m, ok := byShard[sh]
		if !ok {
			return nil, fmt.Errorf("storage: shard %d has no mark (run Migrate)", sh)
		}
		out[i] = m
	}
	return out, nil
}

// ErrLeaseLost is wrapped by Ack's error when another relay took over a
// shard: the messages were published, and the other relay publishes them
// again (at least once; the downstream inbox drops the copies). It is also
// the error for a shard whose row at a Mark's Seq is no longer its EventID:
// the database went back under the relay, and the relay checks the
// partition again before it publishes the shard's rows.
var ErrLeaseLost = errors.New("outbox: the relay's lease on a shard was taken over by another relay")

// ShardCount is how many rows of an Append go to one shard.
type ShardCount struct {
	Shard int32
	Rows  int64
}

// AssignShards sets each row's Shard to its KeyHash modulo shards, and
// returns the shards the rows go to, in ascending order (the order in which
// Append locks them), with their row counts. Adapters call it first in
// Append.
func AssignShards(rows []OutboxRow, shards int) []ShardCount {
	counts := map[int32]int64{}
	for i := range rows {
		rows[i].Shard = int32(rows[i].KeyHash % uint32(shards))
		counts[rows[i].Shard]++
	}
	out := make([]ShardCount, 0, len(counts))
	for sh, n := range counts {
		out = append(out, ShardCount{Shard: sh, Rows: n})
	}
	slices.SortFunc(out, func(a, b ShardCount) int { return cmp.Compare(a.Shard, b.Shard) })
	return out
}

// NumberRows sets each row's Seq: the rows of a shard get consecutive
// numbers from first[shard] on, in the order given.
func NumberRows(rows []OutboxRow, first map[int32]int64) {
	next := maps.Clone(first)
	for i := range rows {
		rows[i].Seq = next[rows[i].Shard]
		next[rows[i].Shard]++
	}
}

// ShareRows splits maxRows among shards (each with the number of its
// unpublished rows, in Rows) and returns how many rows to read from each, in
// the order given, leaving out shards that get none. It fills them evenly
// (water-filling), so a shard with a long backlog (a hot key) never holds up
// the others.
func ShareRows(pending []ShardCount, maxRows int) []ShardCount {
	take := make([]int64, len(pending))
	for left := int64(max(maxRows, 1)); left > 0; {
		var wanting int64
		for i, p := range pending {
			if p.Rows > take[i] {
				wanting++
			}
		}
		if wanting == 0 {
			break
		}
		share := max(left/wanting, 1)
		for i, p := range pending {
			add := min(p.Rows-take[i], share, left)
			if add > 0 {
				take[i] += add
				left -= add
			}
		}
	}
	var out []ShardCount
	for i, p := range pending {
		if take[i] > 0 {
			out = append(out, ShardCount{Shard: p.Shard, Rows: take[i]})
		}
	}
	return out
}

// Notifier is an optional OutboxStore capability: the database itself tells
// relays, in any process, that a transaction that appended rows committed
// (PostgreSQL's LISTEN and NOTIFY), so that they need not poll for it.
// Append of a Notifier has the notification sent inside its transaction,
// so that the database delivers it at commit and never for a transaction
// that rolls back, once per transaction however many calls append, and at
// least whenever a shard it appends to had nothing unpublished (a relay may
// be idle); it may leave it out while the shards it appends to hold
// unpublished rows, which a relay at work finds by polling soon after a
// cycle that published. A notification may also be lost (the listening
// connection breaks): relays go on polling, less often, for that case.
type Notifier interface {
	// Listen opens a connection of its own with db's settings, outside
	// db's pool, that listens for the notifications of Append. It is
	// listening when Listen returns.
	Listen(ctx context.Context, db *gorm.DB) (Listener, error)
}

// Listener is a listening connection of a Notifier.
type Listener interface {
	// Wait returns nil once a notification arrived that an earlier Wait
	// did not return for (it may stand for several commits), and an error
	// when ctx ends or the connection is lost; after an error the Listener
	// is closed, and no notification is delivered again.
	Wait(ctx context.Context) error
	// Close ends the connection.
	Close() error
}
