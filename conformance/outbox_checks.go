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
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

var outboxEnqueueChecks = []Check{
	{Outbox: true, Area: "enqueue", Name: "verify-after-migrate", Doc: "a Store that verifies settings (storage.Verifier) accepts the harness's database after Migrate", Run: checkOutboxVerify},
	{Outbox: true, Area: "enqueue", Name: "commit-publishes", Doc: "messages enqueued in a committed transaction are published once each, with their key, value, headers and event id", Run: checkCommitPublishes},
	{Outbox: true, Area: "enqueue", Name: "rollback-removes", Doc: "a rolled-back transaction leaves neither its effect nor its messages", Run: checkRollbackRemoves},
	{Outbox: true, Area: "enqueue", Name: "invalid-stores-nothing", Doc: "an invalid message, or a *gorm.DB that is no transaction, fails Enqueue before anything is stored", Run: checkInvalidStoresNothing},
}

var outboxOrderChecks = []Check{
	{Outbox: true, Area: "order", Name: "per-key", Doc: "messages of one key enqueued by concurrent writers are published in commit order", Run: checkPerKeyOrder},
	{Outbox: true, Area: "order", Name: "commit-gap", Doc: "a transaction that enqueues for a key after another one did cannot commit, or be published, before it", Run: checkCommitGap},
}

var outboxRelayChecks = []Check{
	{Outbox: true, Area: "relay", Name: "lease-excludes", Doc: "a shard one relay leases is not claimed by another until the lease expires, and the old relay's acknowledgement is then refused", Run: checkLeaseExcludes},
	{Outbox: true, Area: "relay", Name: "hot-key-does-not-starve", Doc: "a claim smaller than one key's backlog still hands out the oldest rows of every other leased shard", Run: checkHotKey},
	{Outbox: true, Area: "relay", Name: "publish-failure", Doc: "messages the broker did not acknowledge are published again, in order, and the acknowledged ones are not", Run: checkPublishFailure},
	{Outbox: true, Area: "relay", Name: "restart", Doc: "a relay that restarts (or another that takes over) continues where the last acknowledgement left off", Run: checkRelayRestart},
	{Outbox: true, Area: "relay", Name: "ack-names-its-event", Doc: "an Ack whose Mark names an event moves the mark only if the shard's row at its Seq is that event (a database that went back holds another one there, or none), and reports the shard's lease lost otherwise", Run: checkAckNamesItsEvent},
	{Outbox: true, Area: "relay", Name: "several-relays", Doc: "several relays running while writers enqueue publish every message, in order per key, without publishing any twice", Run: checkSeveralRelays},
}

var outboxSequenceChecks = []Check{
	{Outbox: true, Sequenced: true, Unmigrated: true, Area: "sequence", Name: "source-stable",
		Doc: "the source id is valid and made once: several Migrate calls at once on fresh tables all read the same one, with epoch 1, and Migrate run again keeps it",
		Run: checkSourceStable},
	{Outbox: true, Sequenced: true, Area: "sequence", Name: "epoch-bump",
		Doc: "BumpEpoch raises the epoch by one each time; later reads through any connection pool see it with the same source id, and Migrate keeps it",
		Run: checkEpochBump},
	{Outbox: true, Sequenced: true, Area: "sequence", Name: "marks-keep-offsets",
		Doc: "a store that reads marks (storage.MarkReader, which an aligned outbox's relay needs for its sequence headers) returns each shard's mark with the offset and epoch stored by the Ack that moved it there, never those of an Ack that did not move it",
		Run: checkMarksKeepOffsets},
	{Outbox: true, Sequenced: true, Area: "sequence", Name: "claim-source",
		Doc: "a store that claims with its source (storage.SourceClaimer, which a relay stamping sequence headers uses instead of Claim and Source) returns the rows Claim would, in order, also when a shard holds more than the claim takes, with the id and epoch Source returns, a BumpEpoch that returned before the call included",
		Run: checkClaimSource},
	{Outbox: true, Sequenced: true, Area: "sequence", Name: "relay-headers",
		Doc: "the relay stamps every message with a key with the source, epoch, shard and seq of its stored row (and a message without a key with none), the same on every copy, and the new epoch after a bump",
		Run: checkSequenceHeaders},
}

var outboxExpiryChecks = []Check{
	{Outbox: true, Area: "expiry", Name: "never-unpublished", Doc: "expiry removes published rows of expired days and keeps, and reports, a day that still holds unpublished rows", Run: checkExpiry},
}

func msgOf(topic, key, value string) outbox.Message {
	return outbox.Message{Topic: topic, Key: []byte(key), Value: []byte(value)}
}

// enqueueTx enqueues msgs through ob, an outbox over the harness's
// database, in a new transaction together with an effect named name, and
// runs the transaction again after a failure the Store calls transient, as
// an application does.
func (env *Env) enqueueTx(ctx context.Context, ob *outbox.Outbox, name string, msgs ...outbox.Message) error {
	for attempt := 1; ; attempt++ {
		err := env.H.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := env.Apply(ctx, tx, outboxEffect(name)); err != nil {
				return err
			}
			return ob.Enqueue(ctx, tx, msgs...)
		})
		if err == nil || !env.H.Outbox.IsRetryable(err) || attempt == 20 || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Duration(attempt) * 5 * time.Millisecond)
	}
}

func checkCommitPublishes(ctx context.Context, env *Env) error {
	ob := env.Outbox()
	at := time.Date(2026, 3, 4, 5, 6, 7, 890_000_000, time.UTC)
	msgs := []outbox.Message{
		{Topic: "orders", Key: []byte("k1"), Value: []byte("v1"), ID: "id-1", Time: at, Headers: []kafka.Header{{Key: "trace", Value: []byte{0, 1, 2}}}},
		{Topic: "orders", Key: nil, Value: []byte("v2")},
		{Topic: "orders.audit", Key: []byte{}, Value: []byte{}},
	}
	if err := env.enqueueTx(ctx, ob, "commit", msgs...); err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	rec := &Recorder{}
	n, err := Drain(ctx, env.Relay(ob, rec, "r1"))
	if err != nil || n != 3 {
		return fmt.Errorf("relay published %d, want 3 (err %v)", n, err)
	}
	got := rec.Messages()
	if len(got) != 3 {
		return fmt.Errorf("publisher got %d messages, want 3", len(got))
	}
	byValue := map[string]kafka.Message{}
	for _, m := range got {
		byValue[string(m.Value)] = m
	}
	m1, ok := byValue["v1"]
	if !ok || string(m1.Key) != "k1" || m1.Topic != "orders" {
		return fmt.Errorf("message v1 published as %+v", m1)
	}
	if id, _ := headerValue(m1, header.EventID); id != "id-1" {
		return fmt.Errorf("message v1: event_id header %q, want id-1", id)
	}
	if ts, _ := headerValue(m1, header.EventTime); ts != "2026-03-04T05:06:07.89Z" {
		return fmt.Errorf("message v1: event_time header %q, want 2026-03-04T05:06:07.89Z", ts)
	}
	if tr, _ := headerValue(m1, "trace"); tr != "\x00\x01\x02" {
		return fmt.Errorf("message v1: header trace %q, want the bytes 0 1 2", tr)
	}
	m2 := byValue["v2"]
	if m2.Key != nil {
		return fmt.Errorf("message v2 had no key and was published with key %q", m2.Key)
	}
	if id, ok := headerValue(m2, header.EventID); !ok || len(id) != 36 || id[14] != '7' {
		return fmt.Errorf("message v2: generated event id %q is not a UUIDv7", id)
	}
	m3, ok := byValue[""]
	if !ok || m3.Key == nil || len(m3.Key) != 0 || m3.Topic != "orders.audit" {
		return fmt.Errorf("message with an empty key and value published as %+v (found %v)", m3, ok)
	}
	if n, err := Drain(ctx, env.Relay(ob, rec, "r1")); err != nil || n != 0 {
		return fmt.Errorf("a second drain published %d (err %v), want 0", n, err)
	}
	return nil
}

func checkRollbackRemoves(ctx context.Context, env *Env) error {
	ob := env.Outbox()
	errAbort := errors.New("abort")
	err := env.H.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := env.Apply(ctx, tx, outboxEffect("rolled-back")); err != nil {
			return err
		}
		if err := ob.Enqueue(ctx, tx, msgOf("orders", "k", "lost")); err != nil {
			return err
		}
		return errAbort
	})
	if !errors.Is(err, errAbort) {
		return fmt.Errorf("transaction: %v", err)
	}
	if err := env.enqueueTx(ctx, ob, "kept", msgOf("orders", "k", "kept")); err != nil {
		return err
	}
	rec := &Recorder{}
	if _, err := Drain(ctx, env.Relay(ob, rec, "r1")); err != nil {
		return err
	}
	if n, err := env.Effects(ctx, outboxEffect("rolled-back")); err != nil || n != 0 {
		return fmt.Errorf("rolled-back effect committed %d times (err %v)", n, err)
	}
	return checkKeyOrder(rec.Messages(), map[string][]string{"orders/k": {"kept"}})
}

func checkInvalidStoresNothing(ctx context.Context, env *Env) error {
	ob := env.Outbox()
	if err := ob.Enqueue(ctx, env.H.DB.WithContext(ctx), msgOf("orders", "k", "no-tx")); !errors.Is(err, inbox.ErrInvalidConfig) {
		return fmt.Errorf("enqueue on a plain *gorm.DB: %v, want an error wrapping inbox.ErrInvalidConfig", err)
	}
	bad := []outbox.Message{
		{Topic: "", Value: []byte("x")},
		{Topic: "bad topic", Value: []byte("x")},
		{Topic: "t", Value: make([]byte, 1<<20)}, // with its framing, over kafka-go's Writer's 1 MiB
		{Topic: "t", Headers: []kafka.Header{{Key: "", Value: []byte("x")}}},
		{Topic: "t", ID: "a", Headers: []kafka.Header{{Key: header.EventID, Value: []byte("b")}}},
		{Topic: "t", ID: "a", Headers: []kafka.Header{{Key: header.CloudEventsID, Value: []byte("b")}}},
		{Topic: "t", Time: time.Unix(0, 0).Add(time.Hour), Headers: []kafka.Header{{Key: header.EventTime, Value: []byte("2020-01-01T00:00:00Z")}}},
		{Topic: "t", Headers: []kafka.Header{{Key: header.EventTime, Value: []byte("yesterday")}}},
		{Topic: "t", ID: "nul\x00id"},
	}
	for i, m := range bad {
		err := env.H.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			err := ob.Enqueue(ctx, tx, msgOf("orders", "k", "valid-"+strconv.Itoa(i)), m)
			if !errors.Is(err, inbox.ErrInvalidMessage) {
				return fmt.Errorf("bad message %d (%+v): Enqueue returned %v, want an error wrapping inbox.ErrInvalidMessage", i, m, err)
			}
			return nil // commit: nothing of the call may be stored
		})
		if err != nil {
			return err
		}
	}
	rec := &Recorder{}
	if n, err := Drain(ctx, env.Relay(ob, rec, "r1")); err != nil || n != 0 {
		return fmt.Errorf("after refused calls the relay published %d (err %v), want 0", n, err)
	}
	return nil
}

func checkPerKeyOrder(ctx context.Context, env *Env) error {
	ob := env.Outbox()
	const writers, keysPerWriter, perKey = 4, 3, 8
	want := map[string][]string{}
	// Whichever way the check returns, its writers are stopped and gone
	// before the harness drops the tables (see checkSeveralRelays).
	writeCtx, stop := context.WithCancel(ctx)
	var wg, watcher sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
		watcher.Wait()
	}()
	errs := make(chan error, writers)
	for w := range writers {
		for k := range keysPerWriter {
			key := fmt.Sprintf("w%d-k%d", w, k)
			for i := range perKey {
				want["orders/"+key] = append(want["orders/"+key], strconv.Itoa(i))
			}
		}
		wg.Go(func() {
			// Each writer commits its keys' messages in turn, so the order
			// of commits per key is known.
			for i := range perKey {
				for k := range keysPerWriter {
					key := fmt.Sprintf("w%d-k%d", w, k)
					if err := env.enqueueTx(writeCtx, ob, key, msgOf("orders", key, strconv.Itoa(i))); err != nil {
						errs <- fmt.Errorf("writer %d: %w", w, err)
						return
					}
				}
			}
		})
	}
	writing := make(chan struct{})
	watcher.Go(func() { wg.Wait(); close(writing) })
	rec := &Recorder{}
	relay := env.Relay(ob, rec, "r1", func(c *outbox.RelayConfig) { c.MaxMessages = 7 })
	// Publish while the writers write, so that the relay meets shards whose
	// writers are still at work.
	for done := false; !done; {
		select {
		case err := <-errs:
			return err
		case <-writing:
			done = true
		default:
		}
		if _, err := relay.PublishOnce(ctx); err != nil {
			return err
		}
	}
	if _, err := Drain(ctx, relay); err != nil {
		return err
	}
	select {
	case err := <-errs:
		return err
	default:
	}
	return checkKeyOrder(rec.Messages(), want)
}

// checkCommitGap is the classic outbox trap: T1 takes the key's next
// number, T2 a later one; if T2 could commit first, a relay reading "after
// the last published" would publish T2's message and never T1's, or
// publish T1's after it.
func checkCommitGap(ctx context.Context, env *Env) error {
	ob := env.Outbox()
	// Whichever way the check returns, T2 and the early relay cycle are
	// stopped and gone, T1 rolled back (which T2 may be waiting for), and
	// db2 closed, in that order, before the harness drops the tables. T1
	// stays under ctx, so that its rollback is its own and not database/sql's,
	// run from a goroutine of its own once runCtx ends.
	runCtx, stop := context.WithCancel(ctx)
	var running sync.WaitGroup
	var closeDB2 func()
	t1 := env.H.DB.WithContext(ctx).Begin()
	if t1.Error != nil {
		stop()
		return t1.Error
	}
	defer func() {
		stop()
		t1.Rollback()
		running.Wait()
		if closeDB2 != nil {
			closeDB2()
		}
	}()
	if err := ob.Enqueue(ctx, t1, msgOf("orders", "gap", "first")); err != nil {
		return fmt.Errorf("T1 enqueue: %w", err)
	}
	var t2Committed time.Time
	t2done := make(chan error, 1)
	db2 := env.H.DB
	if env.H.Open != nil {
		var err error
		if db2, err = env.H.Open(ctx); err != nil {
			return err
		}
		closeDB2 = func() { closeDB(db2) }
	}
	ob2 := env.OutboxOn(db2)
	running.Go(func() {
		err := db2.WithContext(runCtx).Transaction(func(tx *gorm.DB) error {
			return ob2.Enqueue(runCtx, tx, msgOf("orders", "gap", "second"))
		})
		t2Committed = time.Now()
		t2done <- err
	})
	select {
	case err := <-t2done:
		return fmt.Errorf("T2 committed its message for key gap (err %v) while T1, which enqueued for it first, was still open: a relay could publish T2's message before T1's", err)
	case <-time.After(300 * time.Millisecond):
	}
	// A relay cycle while T1 is open must publish nothing of the key. On a
	// single-writer database the cycle waits for the write lock instead:
	// what it publishes after T1 committed is not looked at.
	rec := &Recorder{}
	cycleCtx, cancel := context.WithTimeout(runCtx, 5*time.Second)
	defer cancel()
	cycled := make(chan struct{})
	running.Go(func() {
		defer close(cycled)
		_, _ = env.Relay(env.OutboxOn(db2), rec, "early", func(c *outbox.RelayConfig) { c.Lease = 10 * time.Millisecond }).PublishOnce(cycleCtx)
	})
	select {
	case <-cycled:
	case <-time.After(500 * time.Millisecond):
	}
	if got := rec.Messages(); len(got) > 0 {
		return fmt.Errorf("relay published %d messages of key gap while T1 was open", len(got))
	}
	t1Committed := time.Now()
	if err := t1.Commit().Error; err != nil {
		return fmt.Errorf("T1 commit: %w", err)
	}
	if err := <-t2done; err != nil {
		return fmt.Errorf("T2: %w", err)
	}
	if t2Committed.Before(t1Committed) {
		return errors.New("T2 committed before T1")
	}
	<-cycled
	time.Sleep(100 * time.Millisecond) // the early relay's lease expires
	if _, err := Drain(ctx, env.Relay(ob, rec, "r1")); err != nil {
		return err
	}
	return checkKeyOrder(rec.Messages(), map[string][]string{"orders/gap": {"first", "second"}})
}

func checkLeaseExcludes(ctx context.Context, env *Env) error {
	ob := env.Outbox()
	for i := range 5 {
		if err := env.enqueueTx(ctx, ob, "lease", msgOf("orders", "k"+strconv.Itoa(i), "v")); err != nil {
			return err
		}
	}
	store, db := env.H.Outbox, env.H.DB.WithContext(ctx)
	lease := 400 * time.Millisecond
	a, err := store.Claim(ctx, db, storage.ClaimRequest{Relay: "relay-a", Lease: lease, MaxRows: 100})
	if err != nil || len(a) != 5 {
		return fmt.Errorf("relay A claimed %d rows (err %v), want 5", len(a), err)
	}
	claimedAt := time.Now()
	b, err := store.Claim(ctx, db, storage.ClaimRequest{Relay: "relay-b", Lease: lease, MaxRows: 100})
	if err != nil {
		return err
	}
	if len(b) > 0 && time.Since(claimedAt) < lease {
		return fmt.Errorf("relay B claimed %d rows of shards relay A leases", len(b))
	}
	time.Sleep(time.Until(claimedAt.Add(lease + 100*time.Millisecond)))
	b, err = store.Claim(ctx, db, storage.ClaimRequest{Relay: "relay-b", Lease: 10 * time.Second, MaxRows: 100})
	if err != nil || len(b) != 5 {
		return fmt.Errorf("after relay A's lease expired relay B claimed %d rows (err %v), want 5", len(b), err)
	}
	marks := marksFor(a)
	if err := store.Ack(ctx, db, "relay-a", marks); !errors.Is(err, storage.ErrLeaseLost) {
		return fmt.Errorf("relay A acknowledged shards relay B took over: %v, want ErrLeaseLost", err)
	}
	if err := store.Ack(ctx, db, "relay-b", marksFor(b)); err != nil {
		return fmt.Errorf("relay B ack: %w", err)
	}
	if rest, err := store.Claim(ctx, db, storage.ClaimRequest{Relay: "relay-b", Lease: time.Second, MaxRows: 100}); err != nil || len(rest) != 0 {
		return fmt.Errorf("after the ack %d rows are still unpublished (err %v)", len(rest), err)
	}
	return nil
}

func checkMarksKeepOffsets(ctx context.Context, env *Env) error {
	reader, ok := env.H.Outbox.(storage.MarkReader)
	if !ok {
		return fmt.Errorf("%w: the Outbox store does not implement storage.MarkReader (an aligned outbox's relay needs it)", ErrSkipped)
	}
	ob := env.Outbox()
	for i := range 3 {
		if err := env.enqueueTx(ctx, ob, "marks", msgOf("orders", "marks", strconv.Itoa(i))); err != nil {
			return err
		}
	}
	store, db := env.H.Outbox, env.H.DB.WithContext(ctx)
	rows, err := store.Claim(ctx, db, storage.ClaimRequest{Relay: "relay-a", Lease: 10 * time.Second, MaxRows: 100})
	if err != nil || len(rows) != 3 {
		return fmt.Errorf("claimed %d rows (err %v), want 3", len(rows), err)
	}
	shard := rows[0].Shard
	other := shard
	if sh, ok := store.(storage.Sharded); ok && sh.Shards() > 1 {
		other = (shard + 1) % int32(sh.Shards())
	}
	expect := func(step string, seq, offset, epoch int64) error {
		got, err := reader.Marks(ctx, db, []int32{shard})
		if err != nil {
			return fmt.Errorf("%s: Marks: %w", step, err)
		}
		if len(got) != 1 || got[0] != (storage.Mark{Shard: shard, Seq: seq, Offset: offset, Epoch: epoch}) {
			return fmt.Errorf("%s: Marks returned %+v, want shard %d through %d at offset %d, epoch %d", step, got, shard, seq, offset, epoch)
		}
		return nil
	}
	if err := expect("before any Ack", rows[0].Seq-1, 0, 0); err != nil {
		return err
	}
	steps := []struct {
		name               string
		ack                storage.Mark
		seq, offset, epoch int64
	}{
		{"an Ack that moves the mark", storage.Mark{Shard: shard, Seq: rows[1].Seq, Offset: 41, Epoch: 2}, rows[1].Seq, 41, 2},
		{"an Ack of the same mark", storage.Mark{Shard: shard, Seq: rows[1].Seq, Offset: 99, Epoch: 3}, rows[1].Seq, 41, 2},
		{"an Ack of a lower mark", storage.Mark{Shard: shard, Seq: rows[0].Seq, Offset: 7, Epoch: 1}, rows[1].Seq, 41, 2},
		{"the next Ack that moves it", storage.Mark{Shard: shard, Seq: rows[2].Seq, Offset: 57, Epoch: 5}, rows[2].Seq, 57, 5},
	}
	for _, st := range steps {
		if err := store.Ack(ctx, db, "relay-a", []storage.Mark{st.ack}); err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
		if err := expect("after "+st.name, st.seq, st.offset, st.epoch); err != nil {
			return err
		}
	}
	if err := store.Ack(ctx, db, "relay-b", []storage.Mark{{Shard: shard, Seq: rows[2].Seq + 5, Offset: 1000, Epoch: 9}}); !errors.Is(err, storage.ErrLeaseLost) {
		return fmt.Errorf("an Ack by a relay without the lease: %v, want ErrLeaseLost", err)
	}
	if err := expect("after an Ack without the lease", rows[2].Seq, 57, 5); err != nil {
		return err
	}
	if other != shard {
		got, err := reader.Marks(ctx, db, []int32{other, shard})
		if err != nil || len(got) != 2 || got[0].Shard != other || got[1].Shard != shard {
			return fmt.Errorf("marks of shards %d and %d returned %+v (err %v), want them in that order", other, shard, got, err)
		}
	}
	if got, err := reader.Marks(ctx, db, []int32{1 << 20}); err == nil {
		return fmt.Errorf("marks of a shard the store does not have returned %+v and no error", got)
	}
	return nil
}

func checkClaimSource(ctx context.Context, env *Env) error {
	sc, ok := env.H.Outbox.(storage.SourceClaimer)
	if !ok {
		return fmt.Errorf("%w: the Outbox store does not implement storage.SourceClaimer (optional: the relay then calls Claim and Source)", ErrSkipped)
	}
	ob := env.Outbox()
	// Two keys, 6 messages each: more than the second claim below takes
	// from a shard.
	for i := range 12 {
		if err := env.enqueueTx(ctx, ob, "claim-source", msgOf("orders", "cs-"+strconv.Itoa(i%2), strconv.Itoa(i))); err != nil {
			return err
		}
	}
	store, db := env.H.Outbox, env.H.DB.WithContext(ctx)
	id, _, err := env.sourceOf(ctx, env.H.DB)
	if err != nil {
		return err
	}
	for round, maxRows := range []int{100, 3} {
		bumped, err := env.sequenced().BumpEpoch(ctx, db)
		if err != nil {
			return fmt.Errorf("BumpEpoch: %w", err)
		}
		relay := "claim-source-" + strconv.Itoa(round)
		// A relay of its own each round, after the last one's lease
		// ended: both claim the same rows, as Claim would.
		want, err := store.Claim(ctx, db, storage.ClaimRequest{Relay: relay, Lease: time.Minute, MaxRows: maxRows})
		if err != nil || len(want) == 0 {
			return fmt.Errorf("a Claim of up to %d rows: %d rows (err %v), want some", maxRows, len(want), err)
		}
		if err := store.Release(ctx, db, relay); err != nil {
			return fmt.Errorf("release: %w", err)
		}
		got, gotID, gotEpoch, err := sc.ClaimSource(ctx, db, storage.ClaimRequest{Relay: relay, Lease: time.Minute, MaxRows: maxRows})
		if err != nil {
			return fmt.Errorf("a ClaimSource of up to %d rows: %w", maxRows, err)
		}
		if gotID != id || gotEpoch != bumped {
			return fmt.Errorf("a ClaimSource of up to %d rows after BumpEpoch returned %d: source %q epoch %d, want %q epoch %d", maxRows, bumped, gotID, gotEpoch, id, bumped)
		}
		if len(got) != len(want) {
			return fmt.Errorf("a ClaimSource of up to %d rows returned %d rows, Claim %d", maxRows, len(got), len(want))
		}
		for i := range got {
			if got[i].Shard != want[i].Shard || got[i].Seq != want[i].Seq || got[i].EventID != want[i].EventID {
				return fmt.Errorf("a ClaimSource of up to %d rows: row %d is shard %d seq %d (event %s), Claim's shard %d seq %d (event %s)",
					maxRows, i, got[i].Shard, got[i].Seq, got[i].EventID, want[i].Shard, want[i].Seq, want[i].EventID)
			}
		}
		if err := store.Release(ctx, db, relay); err != nil {
			return fmt.Errorf("release: %w", err)
		}
	}
	return nil
}

func checkAckNamesItsEvent(ctx context.Context, env *Env) error {
	ob := env.Outbox()
	for i := range 3 {
		if err := env.enqueueTx(ctx, ob, "named", msgOf("orders", "named", strconv.Itoa(i))); err != nil {
			return err
		}
	}
	store, db := env.H.Outbox, env.H.DB.WithContext(ctx)
	rows, err := store.Claim(ctx, db, storage.ClaimRequest{Relay: "relay-a", Lease: 10 * time.Second, MaxRows: 100})
	if err != nil || len(rows) != 3 || rows[0].Shard != rows[2].Shard {
		return fmt.Errorf("claimed %d rows (err %v), want 3 of one shard", len(rows), err)
	}
	shard := rows[0].Shard
	for _, st := range []struct {
		name string
		mark storage.Mark
	}{
		{"another event at its Seq", storage.Mark{Shard: shard, Seq: rows[1].Seq, EventID: rows[0].EventID}},
		{"no row at its Seq", storage.Mark{Shard: shard, Seq: rows[2].Seq + 1, EventID: rows[2].EventID}},
	} {
		if err := store.Ack(ctx, db, "relay-a", []storage.Mark{st.mark}); !errors.Is(err, storage.ErrLeaseLost) {
			return fmt.Errorf("an Ack naming %s: %v, want ErrLeaseLost", st.name, err)
		}
	}
	// Nothing moved: every row is still unpublished.
	if again, err := store.Claim(ctx, db, storage.ClaimRequest{Relay: "relay-a", Lease: 10 * time.Second, MaxRows: 100}); err != nil || len(again) != 3 {
		return fmt.Errorf("after the refused Acks %d rows are unpublished (err %v), want 3", len(again), err)
	}
	if err := store.Ack(ctx, db, "relay-a", []storage.Mark{{Shard: shard, Seq: rows[1].Seq, EventID: rows[1].EventID}}); err != nil {
		return fmt.Errorf("an Ack naming the event at its Seq: %w", err)
	}
	rest, err := store.Claim(ctx, db, storage.ClaimRequest{Relay: "relay-a", Lease: 10 * time.Second, MaxRows: 100})
	if err != nil || len(rest) != 1 || rest[0].EventID != rows[2].EventID {
		return fmt.Errorf("after the Ack naming its event %d rows are unpublished (err %v), want the last one", len(rest), err)
	}
	return nil
}

func marksFor(rows []storage.OutboxRow) []storage.Mark {
	var marks []storage.Mark
	for _, r := range rows {
		if n := len(marks); n > 0 && marks[n-1].Shard == r.Shard {
			marks[n-1].Seq = max(marks[n-1].Seq, r.Seq)
			continue
		}
		marks = append(marks, storage.Mark{Shard: r.Shard, Seq: r.Seq})
	}
	return marks
}

func checkPublishFailure(ctx context.Context, env *Env) error {
	ob := env.Outbox()
	want := map[string][]string{}
	for i := range 6 {
		for _, key := range []string{"a", "b", "c"} {
			v := strconv.Itoa(i)
			if err := env.enqueueTx(ctx, ob, key, msgOf("orders", key, v)); err != nil {
				return err
			}
			want["orders/"+key] = append(want["orders/"+key], v)
		}
	}
	calls := 0
	rec := &Recorder{Fail: func(msgs []kafka.Message) error {
		calls++
		switch calls {
		case 1:
			return errors.New("broker unreachable")
		case 2:
			// The broker takes some messages and refuses the rest: from the
			// third on, messages of key b fail.
			each := make(kafka.WriteErrors, len(msgs))
			for i, m := range msgs {
				if i >= 2 && string(m.Key) == "b" {
					each[i] = kafka.NotLeaderForPartition
				}
			}
			return each
		}
		return nil
	}}
	relay := env.Relay(ob, rec, "r1", func(c *outbox.RelayConfig) { c.MaxMessages = 100 })
	if _, err := relay.PublishOnce(ctx); err == nil {
		return errors.New("a failed publish reported no error")
	}
	if len(rec.Messages()) != 0 {
		return errors.New("the failed publish recorded messages")
	}
	if _, err := relay.PublishOnce(ctx); err == nil {
		return errors.New("a partly failed publish reported no error")
	}
	if _, err := Drain(ctx, relay); err != nil {
		return err
	}
	got := rec.Messages()
	if err := checkKeyOrder(got, want); err != nil {
		return err
	}
	// Acknowledged messages are not sent again, except those after a failed
	// one in the same shard.
	if len(got) > 18+18 {
		return fmt.Errorf("%d messages published for 18", len(got))
	}
	return nil
}

func checkRelayRestart(ctx context.Context, env *Env) error {
	ob := env.Outbox()
	want := map[string][]string{}
	for i := range 10 {
		v := strconv.Itoa(i)
		if err := env.enqueueTx(ctx, ob, "restart", msgOf("orders", "k", v), msgOf("orders", "j", v)); err != nil {
			return err
		}
		want["orders/k"] = append(want["orders/k"], v)
		want["orders/j"] = append(want["orders/j"], v)
	}
	rec := &Recorder{}
	first := env.Relay(ob, rec, "r1", func(c *outbox.RelayConfig) { c.MaxMessages = 3 })
	if n, err := first.PublishOnce(ctx); err != nil || n == 0 {
		return fmt.Errorf("first relay published %d (err %v)", n, err)
	}
	// It stops (Run releases its leases on the way out).
	runCtx, cancel := context.WithCancel(ctx)
	cancel()
	_ = first.Run(runCtx)
	second := env.Relay(env.Outbox(), rec, "r2")
	if _, err := Drain(ctx, second); err != nil {
		return err
	}
	got := rec.Messages()
	if len(got) != 20 {
		return fmt.Errorf("%d messages published in all, want 20: the second relay did not continue where the first left off", len(got))
	}
	return checkKeyOrder(got, want)
}

func checkSeveralRelays(ctx context.Context, env *Env) error {
	const writers, keys, perKey, relays = 3, 12, 10, 3
	want := map[string][]string{}
	// Whichever way the check returns, its writers and relays are stopped
	// and gone, and their connections closed, before the harness drops the
	// tables: one left running would hold the database (SQLite's single
	// writer) for whatever runs next.
	runCtx, stop := context.WithCancel(ctx)
	var wg, running sync.WaitGroup
	var pools []*gorm.DB
	defer func() {
		stop()
		wg.Wait()
		running.Wait()
		for _, db := range pools {
			closeDB(db)
		}
	}()
	errs := make(chan error, writers+relays)
	for w := range writers {
		for k := w; k < keys; k += writers {
			for i := range perKey {
				want[fmt.Sprintf("orders/k%d", k)] = append(want[fmt.Sprintf("orders/k%d", k)], strconv.Itoa(i))
			}
		}
		wg.Go(func() {
			ob := env.Outbox()
			for i := range perKey {
				for k := w; k < keys; k += writers {
					if err := env.enqueueTx(runCtx, ob, "several", msgOf("orders", fmt.Sprintf("k%d", k), strconv.Itoa(i))); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	rec := &Recorder{}
	for r := range relays {
		db := env.H.DB
		if env.H.Open != nil {
			var err error
			if db, err = env.H.Open(ctx); err != nil {
				return err
			}
			pools = append(pools, db)
		}
		relay := env.Relay(env.OutboxOn(db), rec, fmt.Sprintf("relay-%d", r), func(c *outbox.RelayConfig) { c.MaxMessages = 10; c.MaxShards = 4 })
		running.Go(func() { _ = relay.Run(runCtx) })
	}
	wg.Wait()
	total := keys * perKey
	deadline := time.Now().Add(20 * time.Second)
	for len(distinct(rec.Messages())) < total && time.Now().Before(deadline) {
		select {
		case err := <-errs:
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
	stop()
	running.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	got := rec.Messages()
	if err := checkKeyOrder(got, want); err != nil {
		return err
	}
	if len(got) != total {
		return fmt.Errorf("%d messages published for %d: relays did the same work twice", len(got), total)
	}
	return nil
}

func distinct(msgs []kafka.Message) map[string]bool {
	seen := map[string]bool{}
	for _, m := range msgs {
		seen[m.Topic+"/"+string(m.Key)+"/"+string(m.Value)] = true
	}
	return seen
}

func checkExpiry(ctx context.Context, env *Env) error {
	// Days: today-6 holds only published rows, today-5 one published and
	// one unpublished row; the retention is 3 days.
	env.Clock.AddDays(-6)
	ob := env.Outbox(func(c *outbox.Config) { c.RetentionDays = 3; c.PrepareDays = 8 })
	if _, err := ob.Maintain(ctx); err != nil {
		return fmt.Errorf("maintain on the first day: %w", err)
	}
	rec := &Recorder{}
	relay := env.Relay(ob, rec, "r1")
	if err := env.enqueueTx(ctx, ob, "e", msgOf("orders", "a", "old-published")); err != nil {
		return err
	}
	if _, err := Drain(ctx, relay); err != nil {
		return err
	}
	env.Clock.AddDays(1)
	if err := env.enqueueTx(ctx, ob, "e", msgOf("orders", "a", "published")); err != nil {
		return err
	}
	if _, err := Drain(ctx, relay); err != nil {
		return err
	}
	if err := env.enqueueTx(ctx, ob, "e", msgOf("orders", "a", "unpublished")); err != nil {
		return err
	}
	env.Clock.AddDays(5)
	oldest, held := env.Today.AddDate(0, 0, -6), env.Today.AddDate(0, 0, -5)
	report, err := ob.Maintain(ctx)
	if err != nil {
		return fmt.Errorf("maintain: %w", err)
	}
	if !slices.ContainsFunc(report.Held, held.Equal) {
		return fmt.Errorf("maintenance report holds %v, want the day %s with an unpublished row", report.Held, held.Format(time.DateOnly))
	}
	if !slices.ContainsFunc(report.Expired, oldest.Equal) {
		return fmt.Errorf("maintenance report expired %v, want the published day %s", report.Expired, oldest.Format(time.DateOnly))
	}
	if sr, ok := env.H.Outbox.(storage.StatsReporter); ok {
		stats, err := sr.Stats(ctx, env.H.DB.WithContext(ctx))
		if err != nil {
			return err
		}
		for _, s := range stats {
			if s.Day.Equal(oldest) {
				return fmt.Errorf("day %s: %d rows left after expiry", oldest.Format(time.DateOnly), s.Rows)
			}
			if s.Day.Equal(held) && s.Unpublished != 1 {
				return fmt.Errorf("day %s: %d unpublished rows, want 1", held.Format(time.DateOnly), s.Unpublished)
			}
		}
	}
	// The kept row is still published, after its key's earlier messages.
	if _, err := Drain(ctx, relay); err != nil {
		return err
	}
	if err := checkKeyOrder(rec.Messages(), map[string][]string{"orders/a": {"old-published", "published", "unpublished"}}); err != nil {
		return fmt.Errorf("after expiry: %w", err)
	}
	report, err = ob.Maintain(ctx)
	if err != nil {
		return err
	}
	if len(report.Held) > 0 || !slices.ContainsFunc(report.Expired, held.Equal) {
		return fmt.Errorf("once published, the held day was not expired: held %v, expired %v", report.Held, report.Expired)
	}
	return nil
}

func checkHotKey(ctx context.Context, env *Env) error {
	ob := env.Outbox()
	hot := make([]outbox.Message, 60)
	for i := range hot {
		hot[i] = msgOf("orders", "hot", strconv.Itoa(i))
	}
	if err := env.enqueueTx(ctx, ob, "hot", hot...); err != nil {
		return err
	}
	// Cold keys, enqueued after the hot backlog; at least one of them
	// falls in another shard.
	for i := range 8 {
		if err := env.enqueueTx(ctx, ob, "cold", msgOf("orders", "cold-"+strconv.Itoa(i), "c")); err != nil {
			return err
		}
	}
	rows, err := env.H.Outbox.Claim(ctx, env.H.DB.WithContext(ctx), storage.ClaimRequest{Relay: "r1", Lease: 10 * time.Second, MaxRows: 20})
	if err != nil {
		return err
	}
	if len(rows) != 20 {
		return fmt.Errorf("claimed %d rows, want 20", len(rows))
	}
	shards := map[int32]bool{}
	for _, r := range rows {
		shards[r.Shard] = true
	}
	if len(shards) < 2 {
		return fmt.Errorf("a claim of 20 rows handed out one shard only (%v) while others had rows waiting: a hot key starves the rest", shards)
	}
	return nil
}

func checkOutboxVerify(ctx context.Context, env *Env) error {
	v, ok := env.H.Outbox.(storage.Verifier)
	if !ok {
		return nil
	}
	if err := v.Verify(ctx, env.H.DB.WithContext(ctx)); err != nil {
		return fmt.Errorf("the Store's Verify after Migrate: %w", err)
	}
	return nil
}
