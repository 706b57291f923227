package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/conformance/atonce"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

var watermarkChecks = []Check{
	{Watermarks: true, Area: "watermark", Name: "round-trip",
		Doc: "values come back byte for byte (NUL and 0xff bytes, trailing NULs and spaces, empty, MaxWatermarkBytes long) through any connection pool, and names differing only in case or trailing spaces are distinct streams",
		Run: checkWatermarkRoundTrip},
	{Watermarks: true, Area: "watermark", Name: "atomic-with-effect",
		Doc: "a watermark written with a business row in one transaction commits with it, and a rollback leaves neither, the watermark at its old value",
		Run: checkWatermarkAtomic},
	{Watermarks: true, Area: "watermark", Name: "compare-and-set",
		Doc: "a write from a stale value, an insert of a stream that has a row and an update of one that has none are ErrWatermarkMoved and change nothing; one such write among several fails the call, and after the rollback none is applied",
		Run: checkWatermarkCAS},
	{Watermarks: true, Area: "watermark", Name: "rejects-invalid-writes",
		Doc: "names out of bounds, not UTF-8 or holding NUL, an epoch below 1, a negative partition, a value over MaxWatermarkBytes, no new value, a new value equal to the old one, or keys not distinct and sorted are ErrInvalidConfig, and nothing is written; Watermarks refuses a scope or topic no row can hold",
		Run: checkWatermarkInvalid},
	{Watermarks: true, Area: "watermark", Name: "second-member-waits",
		Doc: "a member writing from the value another member's open transaction is replacing waits for it: ErrWatermarkMoved if that one commits, written if it rolls back (inserts and updates)",
		Run: checkWatermarkSecondWaits},
	{Watermarks: true, Area: "watermark", Name: "crossed-writes",
		Doc: "two members that each hold one stream and then write the other's (a deadlock; on a database with one writer, a wait for the write lock): one fails with an error the Store's IsRetryable reports, never ErrWatermarkMoved, and the other commits both writes",
		Run: checkWatermarkCrossed},
	{Watermarks: true, Area: "watermark", Name: "racing-members",
		Doc: "16 members write one stream from the same value at once, each with an effect in its transaction: exactly one wins, the others get ErrWatermarkMoved, one effect commits",
		Run: checkWatermarkRace},
	{Watermarks: true, Area: "watermark", Name: "filters",
		Doc: "Watermarks returns exactly the scope's rows of the topic (every topic when empty) and partition (every partition when negative), names compared byte for byte",
		Run: checkWatermarkFilters},
	{Watermarks: true, Area: "watermark", Name: "begin-and-save",
		Doc: "a store that opens the transaction with its writes (storage.WatermarkBeginner) writes them in that transaction: committed with an effect, rolled back with it, a Begin on it refused and a nested Transaction a savepoint, and a stale write is ErrWatermarkMoved with nothing left open (skipped for a store without the capability, or one that cannot use it on the harness's pool: the inbox then begins the transaction itself and calls SaveWatermarks, which the other checks cover)",
		Run: checkWatermarkBeginAndSave},
	{Watermarks: true, Unmigrated: true, Area: "watermark", Name: "migrate-concurrently",
		Doc: "MigrateWatermarks run at the same instant by several processes on a database with the inbox table and no watermark table all succeed, and run again it keeps the rows; a Store that can verify its tables (storage.Verifier) takes the table it made",
		Run: checkWatermarkMigrate},
}

func isWatermarkStore(s storage.InboxStore) bool {
	_, ok := s.(storage.WatermarkStore)
	return ok
}

func (env *Env) watermarks() storage.WatermarkStore { return env.H.Store.(storage.WatermarkStore) }

// errRollback is returned by the suite's transactions that must roll back.
var errRollback = errors.New("conformance: the transaction rolls back on purpose")

// wmKey is a stream of source "src" epoch 1 unless changed.
func wmKey(scope, topic string, partition int32) storage.WatermarkKey {
	return storage.WatermarkKey{Scope: scope, Source: "src", Epoch: 1, Topic: topic, Partition: partition}
}

// wmWrite moves k from one value to another (from nil: k has no row).
func wmWrite(k storage.WatermarkKey, from, to []byte) storage.WatermarkWrite {
	return storage.WatermarkWrite{WatermarkKey: k, Old: from, New: to}
}

// sortWrites puts writes in the order SaveWatermarks takes them.
func sortWrites(writes []storage.WatermarkWrite) {
	slices.SortFunc(writes, func(a, b storage.WatermarkWrite) int { return a.Compare(b.WatermarkKey) })
}

// wmEffect is the effect a watermark check's transaction applies.
func wmEffect(id string) inbox.Message { return inbox.Message{Consumer: "watermark", ID: id} }

// saveTx saves writes in a new transaction on db, with effect applied in
// it unless it is empty, and commits unless fn (run last, if not nil)
// returns an error.
func (env *Env) saveTx(ctx context.Context, db *gorm.DB, effect string, writes []storage.WatermarkWrite, fn func() error) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if effect != "" {
			if err := env.Apply(ctx, tx, wmEffect(effect)); err != nil {
				return fmt.Errorf("effect: %w", err)
			}
		}
		if err := env.watermarks().SaveWatermarks(ctx, tx, writes); err != nil {
			return err
		}
		if fn != nil {
			return fn()
		}
		return nil
	}, env.H.TxOptions)
}

// retried runs fn again while it fails with an error the Store calls
// transient, as the consumer runs its transaction again.
func (env *Env) retried(ctx context.Context, fn func() error) error {
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil || !env.H.Store.IsRetryable(err) || attempt == 50 || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Duration(attempt) * time.Millisecond)
	}
}

// save commits writes (and nothing else), run again after transient
// failures.
func (env *Env) save(ctx context.Context, db *gorm.DB, writes ...storage.WatermarkWrite) error {
	return env.retried(ctx, func() error { return env.saveTx(ctx, db, "", writes, nil) })
}

// stored reads scope's committed rows of topic and partition through db,
// by key, and fails on a row given twice or a nil value (nil would say
// the stream has none).
func (env *Env) stored(ctx context.Context, db *gorm.DB, scope, topic string, partition int32) (map[storage.WatermarkKey][]byte, error) {
	rows, err := env.watermarks().Watermarks(ctx, db.WithContext(ctx), scope, topic, partition)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", filterText(scope, topic, partition), err)
	}
	out := make(map[storage.WatermarkKey][]byte, len(rows))
	for _, r := range rows {
		if _, ok := out[r.WatermarkKey]; ok {
			return nil, fmt.Errorf("%s list %s twice", filterText(scope, topic, partition), streamText(r.WatermarkKey))
		}
		if r.Applied == nil {
			return nil, fmt.Errorf("%s list %s with a nil value: nil means no row", filterText(scope, topic, partition), streamText(r.WatermarkKey))
		}
		out[r.WatermarkKey] = r.Applied
	}
	return out, nil
}

// expectStoredRows checks that got holds exactly want.
func expectStoredRows(what string, got, want map[storage.WatermarkKey][]byte) error {
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			return fmt.Errorf("%s: %s has no row, want %s", what, streamText(k), valueText(w))
		case !bytes.Equal(g, w):
			return fmt.Errorf("%s: %s holds %s, want %s", what, streamText(k), valueText(g), valueText(w))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			return fmt.Errorf("%s: a row for %s (holding %s) that was never written", what, streamText(k), valueText(g))
		}
	}
	return nil
}

// expectValue checks the committed value of k: want nil means no row.
func (env *Env) expectValue(ctx context.Context, what string, k storage.WatermarkKey, want []byte) error {
	got, err := env.stored(ctx, env.H.DB, k.Scope, k.Topic, k.Partition)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	rows := map[storage.WatermarkKey][]byte{}
	for key, v := range got {
		if key == k {
			rows[key] = v
		}
	}
	if want == nil {
		return expectStoredRows(what, rows, nil)
	}
	return expectStoredRows(what, rows, map[storage.WatermarkKey][]byte{k: want})
}

// filterText names what a Watermarks call asks for.
func filterText(scope, topic string, partition int32) string {
	return fmt.Sprintf("the watermarks of scope %q, topic %q, partition %d", scope, topic, partition)
}

func streamText(k storage.WatermarkKey) string {
	return fmt.Sprintf("stream %q/%q[%d] of source %q epoch %d", k.Scope, k.Topic, k.Partition, k.Source, k.Epoch)
}

// valueText shows a value, shortened.
func valueText(v []byte) string {
	if len(v) > 24 {
		return fmt.Sprintf("%d bytes %x...%x", len(v), v[:8], v[len(v)-8:])
	}
	return fmt.Sprintf("%d bytes %x", len(v), v)
}

// otherPool is a second connection pool to the harness database, as another
// member of the group has, or the harness's own without Open; done closes
// it.
func (env *Env) otherPool(ctx context.Context) (db *gorm.DB, done func(), err error) {
	if env.H.Open == nil {
		return env.H.DB, func() {}, nil
	}
	other, err := env.H.Open(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("open another pool: %w", err)
	}
	return other, func() { closeDB(other) }, nil
}

func checkWatermarkRoundTrip(ctx context.Context, env *Env) error {
	long := make([]byte, storage.MaxWatermarkBytes)
	for i := range long {
		long[i] = byte(i*131 + i/256)
	}
	long[0], long[1], long[len(long)-2], long[len(long)-1] = 0x00, 0xff, 0x00, ' '
	scopeMax := strings.Repeat("s", storage.MaxConsumerBytes-1) + "S"
	topicMax := strings.Repeat("t", storage.MaxTopicBytes-1) + "T"
	sourceMax := strings.Repeat("r", storage.MaxSourceBytes-1) + "R"
	key := func(scope, topic string, partition int32, source string, epoch int64) storage.WatermarkKey {
		return storage.WatermarkKey{Scope: scope, Topic: topic, Partition: partition, Source: source, Epoch: epoch}
	}
	values := map[storage.WatermarkKey][]byte{
		key("wm", "orders", 0, "src", 1):  {0x00},
		key("Wm", "orders", 0, "src", 1):  {0xff},
		key("wm ", "orders", 0, "src", 1): {},
		key("wm", "Orders", 0, "src", 1):  {0x00, 0x00},
		key("wm", "orders ", 0, "src", 1): []byte("a "),
		key("wm", "orders", 0, "SRC", 1):  {'a', 0x00},
		key("wm", "orders", 0, "src ", 1): {0xff, 0xfe, 0x00, 0x80},
		key("wm", "orders", 0, "src", 2):  {0x01},
		key("wm", "orders", 1, "src", 1):  {0x02},
	}
	values[key(scopeMax, topicMax, math.MaxInt32, sourceMax, math.MaxInt64)] = long
	writes := make([]storage.WatermarkWrite, 0, len(values))
	scopes := map[string]bool{}
	for k, v := range values {
		writes = append(writes, wmWrite(k, nil, v))
		scopes[k.Scope] = true
	}
	sortWrites(writes)
	if err := env.save(ctx, env.H.DB, writes...); err != nil {
		return fmt.Errorf("inserting %d distinct streams in one call: %w", len(writes), err)
	}
	other, done, err := env.otherPool(ctx)
	if err != nil {
		return err
	}
	defer done()
	// readAll checks every scope's rows through both pools.
	readAll := func(what string, want map[storage.WatermarkKey][]byte) error {
		for scope := range scopes {
			wantScope := map[storage.WatermarkKey][]byte{}
			for k, v := range want {
				if k.Scope == scope {
					wantScope[k] = v
				}
			}
			for pool, db := range map[string]*gorm.DB{"the same": env.H.DB, "another": other} {
				got, err := env.stored(ctx, db, scope, "", -1)
				if err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				if err := expectStoredRows(fmt.Sprintf("%s, read through %s pool", what, pool), got, wantScope); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := readAll("after the inserts", values); err != nil {
		return err
	}
	// Each value moves on, from the value read back.
	next := map[storage.WatermarkKey][]byte{}
	writes = writes[:0]
	for k, v := range values {
		n := append(slices.Clip(v), 0x00)
		if len(v) == storage.MaxWatermarkBytes {
			n = slices.Clone(v)
			n[len(n)-1] = 0x00
		}
		next[k] = n
		writes = append(writes, wmWrite(k, v, n))
	}
	sortWrites(writes)
	if err := env.save(ctx, env.H.DB, writes...); err != nil {
		return fmt.Errorf("updating %d streams from the values read back: %w", len(writes), err)
	}
	return readAll("after the updates", next)
}

func checkWatermarkAtomic(ctx context.Context, env *Env) error {
	k := wmKey("wm-atomic", "orders", 3)
	effect := wmEffect("atomic")
	steps := []struct {
		what       string
		old, new   []byte
		commit     bool
		stored     []byte
		effectsNow int64
	}{
		{"an insert rolled back", nil, []byte("v1"), false, nil, 0},
		{"an insert committed", nil, []byte("v1"), true, []byte("v1"), 1},
		{"an update rolled back", []byte("v1"), []byte("v2"), false, []byte("v1"), 1},
		{"an update committed", []byte("v1"), []byte("v2"), true, []byte("v2"), 2},
	}
	for _, s := range steps {
		err := env.retried(ctx, func() error {
			return env.saveTx(ctx, env.H.DB, effect.ID, []storage.WatermarkWrite{wmWrite(k, s.old, s.new)}, func() error {
				if s.commit {
					return nil
				}
				return errRollback
			})
		})
		if err != nil && (!errors.Is(err, errRollback) || s.commit) {
			return fmt.Errorf("%s: %w", s.what, err)
		}
		if err := env.expectValue(ctx, "after "+s.what, k, s.stored); err != nil {
			return err
		}
		if err := env.expectEffects(ctx, effect, s.effectsNow); err != nil {
			return fmt.Errorf("after %s: %w", s.what, err)
		}
	}
	return nil
}

// expectMoved checks that err says a stream moved.
func expectMoved(what string, err error) error {
	if !errors.Is(err, storage.ErrWatermarkMoved) {
		return fmt.Errorf("%s: %v, want an error wrapping storage.ErrWatermarkMoved", what, err)
	}
	return nil
}

func checkWatermarkCAS(ctx context.Context, env *Env) error {
	a, b, c, d := wmKey("wm-cas", "orders", 0), wmKey("wm-cas", "orders", 1), wmKey("wm-cas", "orders", 2), wmKey("wm-cas", "orders", 3)
	v1 := []byte("v1")
	if err := env.save(ctx, env.H.DB, wmWrite(a, nil, v1), wmWrite(d, nil, v1)); err != nil {
		return fmt.Errorf("first inserts: %w", err)
	}
	// Each attempt rolls back whatever it returns; none may change a row.
	refused := []struct {
		what   string
		writes []storage.WatermarkWrite
	}{
		{"a write from a value the stream never held", []storage.WatermarkWrite{wmWrite(a, []byte("v0"), []byte("v2"))}},
		{"a write from an empty value the stream does not hold", []storage.WatermarkWrite{wmWrite(a, []byte{}, []byte("v2"))}},
		{"an insert of a stream that has a row", []storage.WatermarkWrite{wmWrite(a, nil, []byte("v2"))}},
		{"an update of a stream that has no row", []storage.WatermarkWrite{wmWrite(b, v1, []byte("v2"))}},
		{"valid writes before a stale one", []storage.WatermarkWrite{wmWrite(a, v1, []byte("v2")), wmWrite(c, nil, []byte("c1")), wmWrite(d, []byte("stale"), []byte("v2"))}},
		{"valid writes after a stale one", []storage.WatermarkWrite{wmWrite(a, []byte("stale"), []byte("v2")), wmWrite(c, nil, []byte("c1")), wmWrite(d, v1, []byte("v2"))}},
	}
	for _, r := range refused {
		err := env.retried(ctx, func() error { return env.saveTx(ctx, env.H.DB, "", r.writes, func() error { return errRollback }) })
		if err := expectMoved(r.what, err); err != nil {
			return err
		}
		for k, want := range map[storage.WatermarkKey][]byte{a: v1, b: nil, c: nil, d: v1} {
			if err := env.expectValue(ctx, "after "+r.what+" rolled back", k, want); err != nil {
				return err
			}
		}
	}
	// A moved write is reported when the call returns, not only at commit:
	// a call that says nothing and then commits would have applied the
	// others.
	err := env.retried(ctx, func() error {
		return env.saveTx(ctx, env.H.DB, "", []storage.WatermarkWrite{wmWrite(a, v1, []byte("v2")), wmWrite(d, []byte("stale"), []byte("v2"))}, nil)
	})
	if err := expectMoved("valid and stale writes, committed", err); err != nil {
		return err
	}
	if err := env.expectValue(ctx, "after a call with a stale write", a, v1); err != nil {
		return err
	}
	// From the right values the same writes go through.
	if err := env.save(ctx, env.H.DB, wmWrite(a, v1, []byte("v2")), wmWrite(b, nil, []byte("b1")), wmWrite(d, v1, []byte{})); err != nil {
		return fmt.Errorf("writes from the values held: %w", err)
	}
	for k, want := range map[storage.WatermarkKey][]byte{a: []byte("v2"), b: []byte("b1"), c: nil, d: {}} {
		if err := env.expectValue(ctx, "after writes from the values held", k, want); err != nil {
			return err
		}
	}
	if err := env.save(ctx, env.H.DB, wmWrite(d, []byte{}, []byte("d2"))); err != nil {
		return fmt.Errorf("a write from the empty value held: %w", err)
	}
	return env.expectValue(ctx, "after a write from the empty value held", d, []byte("d2"))
}

func checkWatermarkInvalid(ctx context.Context, env *Env) error {
	k := wmKey("wm-invalid", "orders", 0)
	with := func(change func(*storage.WatermarkKey)) storage.WatermarkKey {
		c := k
		change(&c)
		return c
	}
	later := with(func(k *storage.WatermarkKey) { k.Partition = 1 })
	one := func(w storage.WatermarkWrite) []storage.WatermarkWrite { return []storage.WatermarkWrite{w} }
	cases := []struct {
		what   string
		writes []storage.WatermarkWrite
	}{
		{"keys out of order", []storage.WatermarkWrite{wmWrite(later, nil, []byte("v")), wmWrite(k, nil, []byte("v"))}},
		{"a key twice", []storage.WatermarkWrite{wmWrite(k, nil, []byte("v")), wmWrite(k, []byte("v"), []byte("w"))}},
		{"a NUL byte in the scope", one(wmWrite(with(func(k *storage.WatermarkKey) { k.Scope = "wm-\x00invalid" }), nil, []byte("v")))},
		{"invalid UTF-8 in the topic", one(wmWrite(with(func(k *storage.WatermarkKey) { k.Topic = "orders\xff" }), nil, []byte("v")))},
		{"an empty scope", one(wmWrite(with(func(k *storage.WatermarkKey) { k.Scope = "" }), nil, []byte("v")))},
		{"a scope over MaxConsumerBytes", one(wmWrite(with(func(k *storage.WatermarkKey) { k.Scope = strings.Repeat("s", storage.MaxConsumerBytes+1) }), nil, []byte("v")))},
		{"an empty source", one(wmWrite(with(func(k *storage.WatermarkKey) { k.Source = "" }), nil, []byte("v")))},
		{"a source over MaxSourceBytes", one(wmWrite(with(func(k *storage.WatermarkKey) { k.Source = strings.Repeat("r", storage.MaxSourceBytes+1) }), nil, []byte("v")))},
		{"an empty topic", one(wmWrite(with(func(k *storage.WatermarkKey) { k.Topic = "" }), nil, []byte("v")))},
		{"a topic over MaxTopicBytes", one(wmWrite(with(func(k *storage.WatermarkKey) { k.Topic = strings.Repeat("t", storage.MaxTopicBytes+1) }), nil, []byte("v")))},
		{"epoch 0", one(wmWrite(with(func(k *storage.WatermarkKey) { k.Epoch = 0 }), nil, []byte("v")))},
		{"a negative partition", one(wmWrite(with(func(k *storage.WatermarkKey) { k.Partition = -1 }), nil, []byte("v")))},
		{"a value over MaxWatermarkBytes", one(wmWrite(k, nil, make([]byte, storage.MaxWatermarkBytes+1)))},
		{"no new value", one(wmWrite(k, nil, nil))},
		{"a new value equal to the old one", one(wmWrite(k, []byte("v"), []byte("v")))},
	}
	for _, c := range cases {
		// Committed unless refused: a store that takes the write keeps it.
		err := env.saveTx(ctx, env.H.DB, "", c.writes, nil)
		if !errors.Is(err, storage.ErrInvalidConfig) {
			return fmt.Errorf("a write with %s: %v, want an error wrapping storage.ErrInvalidConfig", c.what, err)
		}
	}
	for _, f := range []struct{ what, scope, topic string }{
		{"an empty scope", "", ""}, {"a NUL byte in the scope", "wm-\x00invalid", ""}, {"a topic over MaxTopicBytes", k.Scope, strings.Repeat("t", storage.MaxTopicBytes+1)},
	} {
		if _, err := env.watermarks().Watermarks(ctx, env.H.DB.WithContext(ctx), f.scope, f.topic, -1); !errors.Is(err, storage.ErrInvalidConfig) {
			return fmt.Errorf("a read of %s: %v, want an error wrapping storage.ErrInvalidConfig", f.what, err)
		}
	}
	got, err := env.stored(ctx, env.H.DB, k.Scope, "", -1)
	if err != nil {
		return err
	}
	return expectStoredRows("after the refused writes", got, nil)
}

func checkWatermarkSecondWaits(ctx context.Context, env *Env) error {
	other, done, err := env.otherPool(ctx)
	if err != nil {
		return err
	}
	defer done()
	for _, insert := range []bool{true, false} {
		for _, commit := range []bool{true, false} {
			what := fmt.Sprintf("insert %v, the first member commits %v", insert, commit)
			if err := secondWaits(ctx, env, other, insert, commit); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
		}
	}
	return nil
}

func checkWatermarkCrossed(ctx context.Context, env *Env) error {
	other, done, err := env.otherPool(ctx)
	if err != nil {
		return err
	}
	defer done()
	a, b := wmKey("wm-crossed", "orders", 0), wmKey("wm-crossed", "orders", 1)
	v := []byte("v")
	if err := env.save(ctx, env.H.DB, wmWrite(a, nil, v), wmWrite(b, nil, v)); err != nil {
		return fmt.Errorf("first values: %w", err)
	}
	pools := [2]*gorm.DB{env.H.DB, other}
	streams := [2][2]storage.WatermarkKey{{a, b}, {b, a}}
	var errs [2]error
	// Each member writes its second stream once both hold their first, or
	// once the other has failed (on a database with one writer the
	// second member waits for the first one's write lock to begin).
	var holding, members sync.WaitGroup
	holding.Add(len(pools))
	for i := range pools {
		members.Go(func() {
			held := sync.OnceFunc(holding.Done)
			defer held()
			value := fmt.Appendf(nil, "member-%d", i)
			errs[i] = pools[i].WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				if err := env.watermarks().SaveWatermarks(ctx, tx, []storage.WatermarkWrite{wmWrite(streams[i][0], v, value)}); err != nil {
					return err
				}
				held()
				holding.Wait()
				return env.watermarks().SaveWatermarks(ctx, tx, []storage.WatermarkWrite{wmWrite(streams[i][1], v, value)})
			}, env.H.TxOptions)
		})
	}
	members.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			return errors.New("both members committed their crossed writes: one of them wrote from a value the other had replaced")
		case err == nil:
			winner = i
		case errors.Is(err, storage.ErrWatermarkMoved):
			return fmt.Errorf("member %d's crossed write: %v, want an error the Store calls retryable, not ErrWatermarkMoved (no value moved: it lost a lock conflict)", i, err)
		case !env.H.Store.IsRetryable(err):
			return fmt.Errorf("member %d's crossed write: %w, which the Store's IsRetryable does not report", i, err)
		}
	}
	if winner < 0 {
		return fmt.Errorf("neither member committed its crossed writes: %w", errors.Join(errs[0], errs[1]))
	}
	want := fmt.Appendf(nil, "member-%d", winner)
	for _, k := range []storage.WatermarkKey{a, b} {
		if err := env.expectValue(ctx, "after the crossed writes", k, want); err != nil {
			return err
		}
	}
	return nil
}

// holdFor is how long a member's transaction holds a stream's row while
// another member writes it.
const holdFor = 300 * time.Millisecond

func secondWaits(ctx context.Context, env *Env, other *gorm.DB, insert, commit bool) error {
	k := wmKey(fmt.Sprintf("wm-wait-%v-%v", insert, commit), "orders", 0)
	var old []byte
	if !insert {
		old = []byte("v1")
		if err := env.save(ctx, env.H.DB, wmWrite(k, nil, old)); err != nil {
			return fmt.Errorf("first value: %w", err)
		}
	}
	first, second := []byte("first"), []byte("second")
	held, end, firstFinished := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var firstErr error
	go func() {
		defer close(firstFinished)
		firstErr = env.saveTx(ctx, env.H.DB, "", []storage.WatermarkWrite{wmWrite(k, old, first)}, func() error {
			close(held)
			<-end
			if commit {
				return nil
			}
			return errRollback
		})
	}()
	release := sync.OnceFunc(func() { close(end) })
	// The first member's transaction ends before the harness goes, on
	// every return.
	defer func() { release(); <-firstFinished }()
	select {
	case <-held:
	case <-firstFinished:
		return fmt.Errorf("the first member's write: %w", firstErr)
	}
	secondDone := make(chan error, 1)
	go func() {
		secondDone <- env.retried(ctx, func() error {
			return env.saveTx(ctx, other, "", []storage.WatermarkWrite{wmWrite(k, old, second)}, nil)
		})
	}()
	select {
	case err := <-secondDone:
		return fmt.Errorf("the second member's write returned (%v) while the first member's transaction was writing the stream: it did not wait for it", err)
	case <-time.After(holdFor):
	}
	release()
	<-firstFinished
	if firstErr != nil && (commit || !errors.Is(firstErr, errRollback)) {
		return fmt.Errorf("the first member's transaction: %w", firstErr)
	}
	var err error
	select {
	case err = <-secondDone:
	case <-ctx.Done():
		return ctx.Err()
	}
	if commit {
		if err := expectMoved("the second member, after the first committed", err); err != nil {
			return err
		}
		return env.expectValue(ctx, "after both", k, first)
	}
	if err != nil {
		return fmt.Errorf("the second member, after the first rolled back: %w", err)
	}
	return env.expectValue(ctx, "after both", k, second)
}

func checkWatermarkRace(ctx context.Context, env *Env) error {
	for _, insert := range []bool{true, false} {
		if err := race(ctx, env, insert); err != nil {
			return fmt.Errorf("racing %s: %w", map[bool]string{true: "inserts", false: "updates"}[insert], err)
		}
	}
	return nil
}

// race has env.H.Concurrency members write one stream from the same value
// at once. Each applies an effect first and holds its transaction open a
// little after the write, so that the others reach the stream while it is
// held (where the database runs writers side by side) or queue behind the
// write lock (SQLite): either way all start from the value before any
// commits, so all but one must find it moved.
func race(ctx context.Context, env *Env, insert bool) error {
	k := wmKey(fmt.Sprintf("wm-race-%v", insert), "orders", 0)
	var old []byte
	if !insert {
		old = []byte("v0")
		if err := env.save(ctx, env.H.DB, wmWrite(k, nil, old)); err != nil {
			return fmt.Errorf("first value: %w", err)
		}
	}
	effect := fmt.Sprintf("race-%v", insert)
	n := env.H.Concurrency
	errs := make([]error, n)
	calls := make([]func() error, n)
	for i := range calls {
		calls[i] = func() error {
			errs[i] = env.retried(ctx, func() error {
				return env.saveTx(ctx, env.H.DB, effect, []storage.WatermarkWrite{wmWrite(k, old, fmt.Appendf(nil, "member-%d", i))}, func() error {
					time.Sleep(20 * time.Millisecond)
					return nil
				})
			})
			return nil
		}
	}
	_ = atonce.Calls(calls...)
	winner := -1
	var other []error
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			return fmt.Errorf("members %d and %d both wrote the stream from %s", winner, i, valueText(old))
		case err == nil:
			winner = i
		case !errors.Is(err, storage.ErrWatermarkMoved):
			other = append(other, fmt.Errorf("member %d: %w", i, err))
		}
	}
	if len(other) > 0 {
		return fmt.Errorf("errors other than ErrWatermarkMoved: %w", errors.Join(other...))
	}
	if winner < 0 {
		return fmt.Errorf("none of %d members wrote the stream", n)
	}
	if err := env.expectEffects(ctx, wmEffect(effect), 1); err != nil {
		return err
	}
	return env.expectValue(ctx, "after the race", k, fmt.Appendf(nil, "member-%d", winner))
}

func checkWatermarkFilters(ctx context.Context, env *Env) error {
	all := map[storage.WatermarkKey][]byte{}
	var writes []storage.WatermarkWrite
	add := func(scope, topic string, partition int32, source string, epoch int64) {
		k := storage.WatermarkKey{Scope: scope, Topic: topic, Partition: partition, Source: source, Epoch: epoch}
		v := []byte(streamText(k))
		all[k] = v
		writes = append(writes, wmWrite(k, nil, v))
	}
	for _, topic := range []string{"t1", "t2", "T1", "t1 "} {
		for p := range int32(3) {
			add("wm-f", topic, p, "a", 1)
		}
	}
	add("wm-f", "t1", 1, "a", 2)
	add("wm-f", "t1", 1, "b", 1)
	add("wm-f2", "t1", 1, "a", 1)
	add("WM-F", "t1", 1, "a", 1)
	sortWrites(writes)
	if err := env.save(ctx, env.H.DB, writes...); err != nil {
		return fmt.Errorf("inserting %d streams: %w", len(writes), err)
	}
	for _, q := range []struct {
		scope, topic string
		partition    int32
	}{
		{"wm-f", "", -1}, {"wm-f", "t1", -1}, {"wm-f", "t1", 1}, {"wm-f", "", 1}, {"wm-f", "T1", 0}, {"wm-f", "t1 ", 2},
		{"wm-f", "t9", -1}, {"wm-f", "t1", 7}, {"wm-f", "", -7}, {"wm-f2", "", -1}, {"WM-F", "", -1}, {"wm-f ", "", -1}, {"wm", "", -1},
	} {
		want := map[storage.WatermarkKey][]byte{}
		for k, v := range all {
			if k.Scope == q.scope && (q.topic == "" || k.Topic == q.topic) && (q.partition < 0 || k.Partition == q.partition) {
				want[k] = v
			}
		}
		got, err := env.stored(ctx, env.H.DB, q.scope, q.topic, q.partition)
		if err != nil {
			return err
		}
		if err := expectStoredRows(filterText(q.scope, q.topic, q.partition), got, want); err != nil {
			return err
		}
	}
	return nil
}

func checkWatermarkMigrate(ctx context.Context, env *Env) error {
	// As when a deployment starts to use sequenced dedup: the inbox table
	// is there (and so is its schema, whose creation could otherwise
	// serialise the callers), the watermark table is new.
	if err := env.H.Store.Migrate(ctx, env.H.DB.WithContext(ctx)); err != nil {
		return fmt.Errorf("migrate the inbox table: %w", err)
	}
	const n = 4
	calls := make([]func() error, n)
	for i := range calls {
		db, done, err := env.otherPool(ctx)
		if err != nil {
			return err
		}
		defer done()
		// Make the pool's connection now, so that the calls start together.
		if err := db.WithContext(ctx).Exec("SELECT 1").Error; err != nil {
			return fmt.Errorf("pool %d: %w", i, err)
		}
		calls[i] = func() error { return env.watermarks().MigrateWatermarks(ctx, db.WithContext(ctx)) }
	}
	if err := atonce.Calls(calls...); err != nil {
		return fmt.Errorf("%d MigrateWatermarks calls at once: %w", n, err)
	}
	k := wmKey("wm-migrate", "orders", 0)
	if err := env.save(ctx, env.H.DB, wmWrite(k, nil, []byte("v1"))); err != nil {
		return fmt.Errorf("a write after concurrent migration: %w", err)
	}
	again := func() error { return env.watermarks().MigrateWatermarks(ctx, env.H.DB.WithContext(ctx)) }
	if err := atonce.Calls(again, again); err != nil {
		return fmt.Errorf("MigrateWatermarks on a migrated database: %w", err)
	}
	if err := env.expectValue(ctx, "after MigrateWatermarks ran again", k, []byte("v1")); err != nil {
		return err
	}
	if v, ok := env.H.Store.(storage.Verifier); ok {
		if err := v.Verify(ctx, env.H.DB); err != nil {
			return fmt.Errorf("the Store's Verify on the table MigrateWatermarks made: %w", err)
		}
	}
	return env.save(ctx, env.H.DB, wmWrite(k, []byte("v1"), []byte("v2")))
}

func checkWatermarkBeginAndSave(ctx context.Context, env *Env) error {
	wb, ok := env.H.Store.(storage.WatermarkBeginner)
	if !ok {
		return fmt.Errorf("%w: the Store does not implement storage.WatermarkBeginner", ErrSkipped)
	}
	k := wmKey("wm-begin", "orders", 0)
	effect, nested := wmEffect("begin"), wmEffect("begin-nested")
	// run opens a transaction with writes, applies the effect in it and
	// commits or rolls back; unavailable says the store cannot open one on
	// the harness's pool (another driver), where the inbox begins itself.
	unavailable := fmt.Errorf("%w: BeginSaveWatermarks cannot open a transaction on this connection pool", ErrSkipped)
	run := func(writes []storage.WatermarkWrite, commit bool) error {
		return env.retried(ctx, func() error {
			tx, ok, err := wb.BeginSaveWatermarks(ctx, env.H.DB.WithContext(ctx), env.H.TxOptions, writes)
			if err != nil {
				return err
			}
			if !ok {
				return unavailable
			}
			if err := env.Apply(ctx, tx, effect); err != nil {
				_ = tx.Rollback().Error
				return fmt.Errorf("effect: %w", err)
			}
			// A handler's Begin fails; its nested Transaction is a
			// savepoint, as in the transactions of BeginClaim.
			if inner := tx.Begin(); inner.Error == nil {
				_ = inner.Rollback().Error
				_ = tx.Rollback().Error
				return errors.New("a Begin on the transaction opened a transaction of its own, which commits apart from the watermark (the transaction must not offer BeginTx)")
			}
			if err := tx.Transaction(func(sp *gorm.DB) error {
				if err := env.Apply(ctx, sp, nested); err != nil {
					return err
				}
				return errRollback
			}); !errors.Is(err, errRollback) {
				_ = tx.Rollback().Error
				return fmt.Errorf("a nested transaction: %v, want its own error", err)
			}
			if !commit {
				return tx.Rollback().Error
			}
			return tx.Commit().Error
		})
	}
	steps := []struct {
		what       string
		old, new   []byte
		commit     bool
		stored     []byte
		effectsNow int64
	}{
		{"an insert rolled back", nil, []byte("v1"), false, nil, 0},
		{"an insert committed", nil, []byte("v1"), true, []byte("v1"), 1},
		{"an update rolled back", []byte("v1"), []byte("v2"), false, []byte("v1"), 1},
		{"an update committed", []byte("v1"), []byte("v2"), true, []byte("v2"), 2},
	}
	for _, s := range steps {
		err := run([]storage.WatermarkWrite{wmWrite(k, s.old, s.new)}, s.commit)
		if errors.Is(err, unavailable) {
			return err
		}
		if err != nil {
			return fmt.Errorf("%s: %w", s.what, err)
		}
		if err := env.expectValue(ctx, "after "+s.what, k, s.stored); err != nil {
			return err
		}
		if err := env.expectEffects(ctx, effect, s.effectsNow); err != nil {
			return fmt.Errorf("after %s: %w", s.what, err)
		}
		if err := env.expectEffects(ctx, nested, 0); err != nil {
			return fmt.Errorf("after %s, the nested transaction rolled back: %w", s.what, err)
		}
	}
	for _, stale := range [][]storage.WatermarkWrite{
		{wmWrite(k, []byte("v1"), []byte("v3"))},
		{wmWrite(k, nil, []byte("v3"))},
	} {
		tx, _, err := wb.BeginSaveWatermarks(ctx, env.H.DB.WithContext(ctx), env.H.TxOptions, stale)
		if tx != nil {
			_ = tx.Rollback().Error
			return errors.New("a stale write opened a transaction")
		}
		if err := expectMoved("a stale write with BEGIN", err); err != nil {
			return err
		}
	}
	if err := env.expectValue(ctx, "after stale writes with BEGIN", k, []byte("v2")); err != nil {
		return err
	}
	// Nothing was left open: every connection of the pool can take the
	// row's lock at once.
	return env.save(ctx, env.H.DB, wmWrite(k, []byte("v2"), []byte("v3")))
}

// CheckNoWatermarkTable checks a WatermarkStore made for an inbox table
// whose name leaves no room for a watermark table: MigrateWatermarks,
// SaveWatermarks and Watermarks each refuse with an error wrapping
// storage.ErrInvalidConfig before they touch a database (they are given
// none). It returns what it found wrong, or nil; adapter tests call it.
func CheckNoWatermarkTable(ctx context.Context, s storage.WatermarkStore) error {
	w := wmWrite(wmKey("s", "t", 0), nil, []byte("v"))
	var errs []error
	for _, c := range []struct {
		method string
		err    error
	}{
		{"MigrateWatermarks", runRecovered("MigrateWatermarks", func() error { return s.MigrateWatermarks(ctx, nil) })},
		{"SaveWatermarks", runRecovered("SaveWatermarks", func() error { return s.SaveWatermarks(ctx, nil, []storage.WatermarkWrite{w}) })},
		{"Watermarks", runRecovered("Watermarks", func() error { _, err := s.Watermarks(ctx, nil, "s", "", -1); return err })},
	} {
		if !errors.Is(c.err, storage.ErrInvalidConfig) {
			errs = append(errs, fmt.Errorf("%s without a watermark table: %v, want an error wrapping storage.ErrInvalidConfig", c.method, c.err))
		}
	}
	return errors.Join(errs...)
}

// CheckWatermarkLockWait checks that a member whose write waits for a
// stream's row (or the database's write lock) longer than its database
// lets it gives up with an error the store's IsRetryable reports, never
// ErrWatermarkMoved: an open transaction on db holds the stream while one
// on waiter, prepared by shortWait (nil for nothing; a short lock timeout
// for its session, say), writes it from the same value. The store's
// watermark table must exist on db. It returns what it found wrong, or
// nil; adapter tests call it with their dialect's way to wait briefly.
func CheckWatermarkLockWait(ctx context.Context, store storage.InboxStore, db, waiter *gorm.DB, shortWait func(tx *gorm.DB) error) error {
	ws, ok := store.(storage.WatermarkStore)
	if !ok {
		return fmt.Errorf("the store's type %T does not implement storage.WatermarkStore", store)
	}
	k := wmKey("wm-lock-wait", "orders", 0)
	v := []byte("v")
	if err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		return ws.SaveWatermarks(ctx, tx, []storage.WatermarkWrite{wmWrite(k, nil, v)})
	}); err != nil {
		return fmt.Errorf("first value: %w", err)
	}
	holder := db.WithContext(ctx).Begin()
	if holder.Error != nil {
		return fmt.Errorf("begin the holder's transaction: %w", holder.Error)
	}
	defer holder.Rollback()
	if err := ws.SaveWatermarks(ctx, holder, []storage.WatermarkWrite{wmWrite(k, v, []byte("held"))}); err != nil {
		return fmt.Errorf("the holder's write: %w", err)
	}
	err := waiter.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if shortWait != nil {
			if err := shortWait(tx); err != nil {
				return fmt.Errorf("shorten the wait: %w", err)
			}
		}
		return ws.SaveWatermarks(ctx, tx, []storage.WatermarkWrite{wmWrite(k, v, []byte("waiter"))})
	})
	switch {
	case err == nil:
		return errors.New("a write of a stream another transaction holds succeeded: it did not wait for the holder")
	case errors.Is(err, storage.ErrWatermarkMoved):
		return fmt.Errorf("a write that waited past its lock wait: %w, want an error the store calls retryable, not ErrWatermarkMoved", err)
	case !store.IsRetryable(err):
		return fmt.Errorf("a write that waited past its lock wait: %w, which the store's IsRetryable does not report", err)
	}
	return nil
}
