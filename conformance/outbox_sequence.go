package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

func isSequenced(s storage.OutboxStore) bool {
	_, ok := s.(storage.Sequenced)
	return ok
}

func (env *Env) sequenced() storage.Sequenced { return env.H.Outbox.(storage.Sequenced) }

// sourceOf reads the store's source id and epoch through db and checks the
// id's form.
func (env *Env) sourceOf(ctx context.Context, db *gorm.DB) (string, int64, error) {
	id, epoch, err := env.sequenced().Source(ctx, db.WithContext(ctx))
	if err != nil {
		return "", 0, fmt.Errorf("Source: %w", err)
	}
	if err := storage.ValidSource(id); err != nil {
		return "", 0, fmt.Errorf("Source: %w", err)
	}
	return id, epoch, nil
}

func checkSourceStable(ctx context.Context, env *Env) error {
	const n = 4
	var mu sync.Mutex
	var seen []string
	err := env.asProcesses(ctx, n, func(db *gorm.DB) error {
		if err := env.H.Outbox.Migrate(ctx, db.WithContext(ctx)); err != nil {
			return fmt.Errorf("Migrate: %w", err)
		}
		id, epoch, err := env.sourceOf(ctx, db)
		if err != nil {
			return err
		}
		if epoch != 1 {
			return fmt.Errorf("the epoch of fresh tables is %d, want 1", epoch)
		}
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, id)
		return nil
	})
	if err != nil {
		return fmt.Errorf("concurrent Migrate: %w", err)
	}
	slices.Sort(seen)
	if seen = slices.Compact(seen); len(seen) != 1 {
		return fmt.Errorf("%d Migrate calls at once on fresh tables read %d source ids, %q: want one", n, len(seen), seen)
	}
	for i := range 2 {
		if err := env.H.Outbox.Migrate(ctx, env.H.DB.WithContext(ctx)); err != nil {
			return fmt.Errorf("Migrate again: %w", err)
		}
		id, epoch, err := env.sourceOf(ctx, env.H.DB)
		if err != nil {
			return err
		}
		if id != seen[0] || epoch != 1 {
			return fmt.Errorf("after Migrate ran again (%d): source %q epoch %d, want %q epoch 1", i+1, id, epoch, seen[0])
		}
	}
	return nil
}

func checkEpochBump(ctx context.Context, env *Env) error {
	db := env.H.DB
	other := db
	if env.H.Open != nil {
		var err error
		if other, err = env.H.Open(ctx); err != nil {
			return err
		}
		defer closeDB(other)
	}
	id, epoch, err := env.sourceOf(ctx, db)
	if err != nil {
		return err
	}
	if epoch != 1 {
		return fmt.Errorf("the epoch after Migrate is %d, want 1", epoch)
	}
	for want := int64(2); want <= 3; want++ {
		got, err := env.sequenced().BumpEpoch(ctx, db.WithContext(ctx))
		if err != nil {
			return fmt.Errorf("BumpEpoch: %w", err)
		}
		if got != want {
			return fmt.Errorf("BumpEpoch returned epoch %d, want %d", got, want)
		}
		for name, pool := range map[string]*gorm.DB{"the same": db, "another": other} {
			gotID, gotEpoch, err := env.sourceOf(ctx, pool)
			if err != nil {
				return err
			}
			if gotID != id || gotEpoch != want {
				return fmt.Errorf("after BumpEpoch returned %d, a read through %s connection pool found source %q epoch %d, want %q epoch %d",
					want, name, gotID, gotEpoch, id, want)
			}
		}
	}
	if err := env.H.Outbox.Migrate(ctx, db.WithContext(ctx)); err != nil {
		return fmt.Errorf("Migrate again: %w", err)
	}
	if gotID, gotEpoch, err := env.sourceOf(ctx, db); err != nil || gotID != id || gotEpoch != 3 {
		return fmt.Errorf("after Migrate ran again: source %q epoch %d (err %v), want %q epoch 3", gotID, gotEpoch, err, id)
	}
	return nil
}

// errAckLost is what lostAcks answers.
var errAckLost = errors.New("the broker's acknowledgement was lost")

// lostAcks is a Publisher whose broker takes every message and whose
// acknowledgement never reaches the relay, which then dies as if it
// crashed before marking them published: the messages are out, and the
// relay that takes the shards over publishes them again.
type lostAcks struct{ Recorder }

func (p *lostAcks) Publish(ctx context.Context, msgs []kafka.Message) error {
	if err := p.Recorder.Publish(ctx, msgs); err != nil {
		return err
	}
	return errAckLost
}

// sequenceHeaderNames are the sequence headers of both styles.
var sequenceHeaderNames = []string{header.SeqSource, header.SeqEpoch, header.SeqShard, header.Seq,
	header.CloudEventsSeqSource, header.CloudEventsSeqEpoch, header.CloudEventsSeqShard, header.CloudEventsSequence}

// expectSequence checks that m carries the sequence headers (EventHeaders
// style) of row under source and epoch, each once, or none when the row has
// no key.
func expectSequence(m kafka.Message, row storage.OutboxRow, source string, epoch int64) error {
	count := map[string]int{}
	value := map[string]string{}
	for _, h := range m.Headers {
		if slices.Contains(sequenceHeaderNames, h.Key) {
			count[h.Key]++
			value[h.Key] = string(h.Value)
		}
	}
	if row.Key == nil {
		if len(count) > 0 {
			return fmt.Errorf("message %s has no key and carries sequence headers %v", row.EventID, value)
		}
		return nil
	}
	want := map[string]string{
		header.SeqSource: source,
		header.SeqEpoch:  strconv.FormatInt(epoch, 10),
		header.SeqShard:  strconv.FormatInt(int64(row.Shard), 10),
		header.Seq:       strconv.FormatInt(row.Seq, 10),
	}
	for k, w := range want {
		if count[k] != 1 || value[k] != w {
			return fmt.Errorf("message %s (stored in shard %d at seq %d): header %s is %q (%d times), want %q once",
				row.EventID, row.Shard, row.Seq, k, value[k], count[k], w)
		}
	}
	if len(count) != len(want) {
		return fmt.Errorf("message %s carries sequence headers %v, want only %v", row.EventID, value, want)
	}
	return nil
}

// storedRows reads every unpublished row, in (shard, seq) order, by
// claiming them as a relay of its own and releasing them again.
func (env *Env) storedRows(ctx context.Context) ([]storage.OutboxRow, error) {
	db := env.H.DB.WithContext(ctx)
	rows, err := env.H.Outbox.Claim(ctx, db, storage.ClaimRequest{Relay: "reader", Lease: 10 * time.Second, MaxRows: 1000})
	if err != nil {
		return nil, fmt.Errorf("claim to read the stored rows: %w", err)
	}
	if err := env.H.Outbox.Release(ctx, db, "reader"); err != nil {
		return nil, fmt.Errorf("release after reading the stored rows: %w", err)
	}
	return rows, nil
}

// contiguous checks that the seq numbers of rows (in (shard, seq) order)
// run without gaps in each shard, from after[shard]+1.
func contiguous(rows []storage.OutboxRow, after map[int32]int64) error {
	next := map[int32]int64{}
	for _, r := range rows {
		if _, ok := next[r.Shard]; !ok {
			next[r.Shard] = after[r.Shard] + 1
		}
		if r.Seq != next[r.Shard] {
			return fmt.Errorf("shard %d: seq %d follows seq %d", r.Shard, r.Seq, next[r.Shard]-1)
		}
		next[r.Shard]++
	}
	return nil
}

func checkSequenceHeaders(ctx context.Context, env *Env) error {
	ob := env.Outbox()
	source, epoch, err := env.sourceOf(ctx, env.H.DB)
	if err != nil {
		return err
	}
	for i := range 6 {
		v := strconv.Itoa(i)
		msgs := []outbox.Message{msgOf("orders", "k"+strconv.Itoa(i%3), v), msgOf("audit", "k", v)}
		if i%3 == 0 {
			msgs = append(msgs, outbox.Message{Topic: "orders", Value: []byte("keyless-" + v)}, outbox.Message{Topic: "orders", Key: []byte{}, Value: []byte("empty-key-" + v)})
		}
		if err := env.enqueueTx(ctx, ob, "sequence", msgs...); err != nil {
			return err
		}
	}
	rows, err := env.storedRows(ctx)
	if err != nil {
		return err
	}
	if len(rows) != 16 {
		return fmt.Errorf("%d rows stored, want 16", len(rows))
	}
	if err := contiguous(rows, nil); err != nil {
		return fmt.Errorf("stored rows: %w", err)
	}
	byID := map[string]storage.OutboxRow{}
	for _, r := range rows {
		byID[r.EventID] = r
	}
	// checkAll checks every message of got against its stored row, and that
	// every row of want was published.
	checkAll := func(what string, got []kafka.Message, want []storage.OutboxRow, epoch int64) (map[string]kafka.Message, error) {
		first := map[string]kafka.Message{}
		for _, m := range got {
			id, _ := headerValue(m, header.EventID)
			row, ok := byID[id]
			if !ok {
				return nil, fmt.Errorf("%s: published message %q (event %q) was not stored", what, m.Value, id)
			}
			if err := expectSequence(m, row, source, epoch); err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
			if _, ok := first[id]; !ok {
				first[id] = m
			}
		}
		for _, r := range want {
			if _, ok := first[r.EventID]; !ok {
				return nil, fmt.Errorf("%s: stored row shard %d seq %d (event %s) was not published", what, r.Shard, r.Seq, r.EventID)
			}
		}
		return first, nil
	}

	// Relay A publishes everything and dies before marking it published;
	// relay B takes over once A's leases expired and publishes it again.
	lost := &lostAcks{}
	const lease = 300 * time.Millisecond
	started := time.Now()
	a := env.Relay(ob, lost, "relay-a", func(c *outbox.RelayConfig) { c.Lease = lease; c.MaxMessages = 100 })
	if _, err := a.PublishOnce(ctx); !errors.Is(err, errAckLost) {
		return fmt.Errorf("relay A's cycle: %v, want the lost acknowledgement", err)
	}
	fromA, err := checkAll("relay A", lost.Messages(), rows, epoch)
	if err != nil {
		return err
	}
	time.Sleep(time.Until(started.Add(lease + 100*time.Millisecond)))
	rec := &Recorder{}
	if _, err := Drain(ctx, env.Relay(env.Outbox(), rec, "relay-b", func(c *outbox.RelayConfig) { c.MaxMessages = 100 })); err != nil {
		return fmt.Errorf("relay B: %w", err)
	}
	if err := env.H.Outbox.Release(ctx, env.H.DB.WithContext(ctx), "relay-b"); err != nil {
		return fmt.Errorf("relay B's release: %w", err)
	}
	fromB, err := checkAll("relay B, taking over", rec.Messages(), rows, epoch)
	if err != nil {
		return err
	}
	for id, m := range fromA {
		if !slices.Equal(sequenceOf(m), sequenceOf(fromB[id])) {
			return fmt.Errorf("event %s: relay A published sequence headers %q, relay B %q", id, sequenceOf(m), sequenceOf(fromB[id]))
		}
	}

	// After a bump, the rows published carry the new epoch and their
	// shards' numbers go on.
	bumped, err := env.sequenced().BumpEpoch(ctx, env.H.DB.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("BumpEpoch: %w", err)
	}
	if bumped != epoch+1 {
		return fmt.Errorf("BumpEpoch returned %d, want %d", bumped, epoch+1)
	}
	last := map[int32]int64{}
	for _, r := range rows {
		last[r.Shard] = max(last[r.Shard], r.Seq)
	}
	for i := range 3 {
		if err := env.enqueueTx(ctx, ob, "sequence", msgOf("orders", "k"+strconv.Itoa(i), "after-bump")); err != nil {
			return err
		}
	}
	later, err := env.storedRows(ctx)
	if err != nil {
		return err
	}
	if len(later) != 3 {
		return fmt.Errorf("%d rows stored after the bump, want 3", len(later))
	}
	if err := contiguous(later, last); err != nil {
		return fmt.Errorf("rows stored after the bump: %w", err)
	}
	for _, r := range later {
		byID[r.EventID] = r
	}
	after := &Recorder{}
	if _, err := Drain(ctx, env.Relay(env.Outbox(), after, "relay-c")); err != nil {
		return fmt.Errorf("relay after the bump: %w", err)
	}
	if _, err := checkAll("after the epoch was bumped", after.Messages(), later, bumped); err != nil {
		return err
	}
	return nil
}

// sequenceOf returns the sequence headers of m, in order.
func sequenceOf(m kafka.Message) []string {
	var out []string
	for _, h := range m.Headers {
		if slices.Contains(sequenceHeaderNames, h.Key) {
			out = append(out, h.Key+"="+string(h.Value))
		}
	}
	return out
}
