package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/conformance/atonce"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

var offsetChecks = []Check{
	{Offsets: true, Area: "offsets", Name: "round-trip-and-filters",
		Doc: "a write creates the partition's row and a later one replaces it; Offsets returns exactly the group's rows of the topic (every topic when empty) and partition (every partition when negative), sorted, with the writer's generation and the fingerprint of the message before the offset (0 when the write had none)",
		Run: checkOffsetsRoundTrip},
	{Offsets: true, Area: "offsets", Name: "atomic-with-effect",
		Doc: "an offset written with a business row in one transaction commits with it, and a rollback leaves neither: no row for a first write, the old offset for a later one",
		Run: checkOffsetsAtomic},
	{Offsets: true, Area: "offsets", Name: "floor-refuses-a-moved-row",
		Doc: "a write with a Floor is ErrOffsetMoved, and changes nothing, when the row went back below the Floor or is missing; at or past the Floor it is written, and without a Floor it is written wherever the row stands",
		Run: checkOffsetsFloor},
	{Offsets: true, Area: "offsets", Name: "newer-generation-fences",
		Doc: "a write of an older generation than the row's is an *OffsetTakenOverError naming the row, and changes nothing; ClaimOffset raises an older row's generation (a newer one's is returned unchanged), after which the older generation's writes are refused; AdoptOffset moves the generation from the given one only",
		Run: checkOffsetsFence},
	{Offsets: true, Area: "offsets", Name: "second-writer-waits",
		Doc: "a write of an older generation, while a newer generation's open transaction writes the row, waits for it: *OffsetTakenOverError if it commits, written if it rolls back",
		Run: checkOffsetsSecondWaits},
	{Offsets: true, Area: "offsets", Name: "reset",
		Doc: "ResetOffsets sets the group's partitions of the topic given, creating missing rows, clears their fingerprint, keeps their generation, and leaves other partitions and groups alone",
		Run: checkOffsetsReset},
	{Offsets: true, Unmigrated: true, Area: "offsets", Name: "migrate-concurrently",
		Doc: "MigrateOffsets run at the same instant by several processes all succeed, and run again it keeps the rows; a table of the first layout (group_id, topic, partition, next_offset) is upgraded with its rows readable (generation 0, no fingerprint)",
		Run: checkOffsetsMigrate},
}

func isOffsetStore(s storage.InboxStore) bool {
	_, ok := s.(storage.OffsetStore)
	return ok
}

func (env *Env) offsets() storage.OffsetStore { return env.H.Store.(storage.OffsetStore) }

func offKey(group, topic string, partition int32) storage.OffsetKey {
	return storage.OffsetKey{Group: group, Topic: topic, Partition: partition}
}

// offWrite is a write of k at next by generation gen, without a floor or
// fingerprint.
func offWrite(k storage.OffsetKey, next int64, gen int32) storage.OffsetWrite {
	return storage.OffsetWrite{OffsetKey: k, Next: next, Generation: gen, Floor: -1}
}

// offEffect is the effect an offsets check's transaction applies.
func offEffect(id string) inbox.Message { return inbox.Message{Consumer: "offsets", ID: id} }

// saveOffsetTx writes w in a transaction on db, with the effect named
// effect first (none if empty), then runs fn (nil: commit).
func (env *Env) saveOffsetTx(ctx context.Context, db *gorm.DB, effect string, w storage.OffsetWrite, fn func() error) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if effect != "" {
			if err := env.Apply(ctx, tx, offEffect(effect)); err != nil {
				return fmt.Errorf("effect: %w", err)
			}
		}
		if err := env.offsets().SaveOffset(ctx, tx, env.offsetsTable, w); err != nil {
			return err
		}
		if fn != nil {
			return fn()
		}
		return nil
	}, env.H.TxOptions)
}

// saveOffset commits w (and nothing else), run again after transient
// failures.
func (env *Env) saveOffset(ctx context.Context, db *gorm.DB, w storage.OffsetWrite) error {
	return env.retried(ctx, func() error { return env.saveOffsetTx(ctx, db, "", w, nil) })
}

// offsetRow reads k's committed row; found is false if there is none.
func (env *Env) offsetRow(ctx context.Context, k storage.OffsetKey) (storage.OffsetRow, bool, error) {
	rows, err := env.offsets().Offsets(ctx, env.H.DB.WithContext(ctx), env.offsetsTable, k.Group, k.Topic, k.Partition)
	switch {
	case err != nil:
		return storage.OffsetRow{}, false, fmt.Errorf("read %s: %w", offText(k), err)
	case len(rows) > 1:
		return storage.OffsetRow{}, false, fmt.Errorf("read %s: %d rows, want at most 1", offText(k), len(rows))
	case len(rows) == 0:
		return storage.OffsetRow{}, false, nil
	}
	return rows[0], true, nil
}

// expectOffset checks k's committed row: want, or none when want.Next is
// negative.
func (env *Env) expectOffset(ctx context.Context, when string, want storage.OffsetRow) error {
	got, found, err := env.offsetRow(ctx, want.OffsetKey)
	switch {
	case err != nil:
		return fmt.Errorf("%s: %w", when, err)
	case want.Next < 0 && found:
		return fmt.Errorf("%s: %s holds %+v, want no row", when, offText(want.OffsetKey), got)
	case want.Next < 0:
		return nil
	case !found:
		return fmt.Errorf("%s: %s has no row, want %+v", when, offText(want.OffsetKey), want)
	case got != want:
		return fmt.Errorf("%s: %s holds %+v, want %+v", when, offText(want.OffsetKey), got, want)
	}
	return nil
}

func offText(k storage.OffsetKey) string {
	return fmt.Sprintf("the stored offset of group %q, %q[%d]", k.Group, k.Topic, k.Partition)
}

func row(k storage.OffsetKey, next int64, gen int32, last int64) storage.OffsetRow {
	return storage.OffsetRow{OffsetKey: k, Next: next, Generation: gen, Last: last}
}

func checkOffsetsRoundTrip(ctx context.Context, env *Env) error {
	writes := []storage.OffsetWrite{
		{OffsetKey: offKey("g1", "orders", 1), Next: 10, Generation: 3, Last: -77, Floor: -1},
		{OffsetKey: offKey("g1", "orders", 0), Next: 5, Generation: 3, Floor: -1},
		{OffsetKey: offKey("g1", "Orders", 0), Next: 1, Generation: 1, Last: 1 << 62, Floor: -1},
		{OffsetKey: offKey("g1", "billing", 7), Next: 3, Generation: 2, Last: 9, Floor: -1},
		{OffsetKey: offKey("g2", "orders", 0), Next: 99, Generation: 1, Floor: -1},
		{OffsetKey: offKey("G1", "orders", 0), Next: 42, Generation: 1, Floor: -1},
		// A later write of a row: replaces it, its fingerprint too.
		{OffsetKey: offKey("g1", "orders", 0), Next: 6, Generation: 4, Last: 12345, Floor: 5},
	}
	for _, w := range writes {
		if err := env.saveOffset(ctx, env.H.DB, w); err != nil {
			return fmt.Errorf("write %+v: %w", w, err)
		}
	}
	rowOf := func(w storage.OffsetWrite) storage.OffsetRow { return row(w.OffsetKey, w.Next, w.Generation, w.Last) }
	// Sorted by topic (byte order) and partition.
	g1 := []storage.OffsetRow{rowOf(writes[2]), rowOf(writes[3]), rowOf(writes[6]), rowOf(writes[0])}
	for _, f := range []struct {
		group, topic string
		partition    int32
		want         []storage.OffsetRow
	}{
		{"g1", "", -1, g1},
		{"g1", "orders", -1, []storage.OffsetRow{rowOf(writes[6]), rowOf(writes[0])}},
		{"g1", "orders", 1, []storage.OffsetRow{rowOf(writes[0])}},
		{"g1", "", 0, []storage.OffsetRow{rowOf(writes[2]), rowOf(writes[6])}},
		{"g1", "orders", 2, nil},
		{"g1", "missing", -1, nil},
		{"g2", "", -1, []storage.OffsetRow{rowOf(writes[4])}},
		{"G1", "orders", 0, []storage.OffsetRow{rowOf(writes[5])}},
		{"g3", "", -1, nil},
	} {
		got, err := env.offsets().Offsets(ctx, env.H.DB.WithContext(ctx), env.offsetsTable, f.group, f.topic, f.partition)
		if err != nil {
			return fmt.Errorf("Offsets(%q, %q, %d): %w", f.group, f.topic, f.partition, err)
		}
		if !slices.Equal(got, f.want) {
			return fmt.Errorf("Offsets(%q, %q, %d) = %+v, want %+v", f.group, f.topic, f.partition, got, f.want)
		}
	}
	return nil
}

func checkOffsetsAtomic(ctx context.Context, env *Env) error {
	k := offKey("g", "orders", 3)
	effect := offEffect("atomic")
	steps := []struct {
		what       string
		next       int64
		commit     bool
		stored     int64 // -1: no row
		effectsNow int64
	}{
		{"a first write rolled back", 5, false, -1, 0},
		{"a first write committed", 5, true, 5, 1},
		{"a later write rolled back", 9, false, 5, 1},
		{"a later write committed", 9, true, 9, 2},
	}
	for _, s := range steps {
		err := env.retried(ctx, func() error {
			return env.saveOffsetTx(ctx, env.H.DB, effect.ID, offWrite(k, s.next, 1), func() error {
				if s.commit {
					return nil
				}
				return errRollback
			})
		})
		if err != nil && (!errors.Is(err, errRollback) || s.commit) {
			return fmt.Errorf("%s: %w", s.what, err)
		}
		if err := env.expectOffset(ctx, "after "+s.what, row(k, s.stored, 1, 0)); err != nil {
			return err
		}
		if err := env.expectEffects(ctx, effect, s.effectsNow); err != nil {
			return fmt.Errorf("after %s: %w", s.what, err)
		}
	}
	return nil
}

// expectOffsetMoved checks that err says the row moved.
func expectOffsetMoved(what string, err error) error {
	if !errors.Is(err, storage.ErrOffsetMoved) {
		return fmt.Errorf("%s: %v, want an error wrapping storage.ErrOffsetMoved", what, err)
	}
	return nil
}

func checkOffsetsFloor(ctx context.Context, env *Env) error {
	k := offKey("g", "orders", 0)
	if err := env.saveOffset(ctx, env.H.DB, storage.OffsetWrite{OffsetKey: k, Next: 10, Generation: 2, Last: 7, Floor: -1}); err != nil {
		return fmt.Errorf("first write: %w", err)
	}
	// The row went back below what the writer committed (a failover that
	// lost commits): refused, the row as it was.
	err := env.saveOffset(ctx, env.H.DB, storage.OffsetWrite{OffsetKey: k, Next: 12, Generation: 2, Last: 8, Floor: 11})
	if err := expectOffsetMoved("a write with a floor above the row", err); err != nil {
		return err
	}
	if err := env.expectOffset(ctx, "after the refused write", row(k, 10, 2, 7)); err != nil {
		return err
	}
	// A newer generation's write too: the floor is checked whatever the
	// generation.
	err = env.saveOffset(ctx, env.H.DB, storage.OffsetWrite{OffsetKey: k, Next: 12, Generation: 3, Floor: 11})
	if err := expectOffsetMoved("a newer generation's write with a floor above the row", err); err != nil {
		return err
	}
	// At the floor, and past it: written.
	for _, w := range []storage.OffsetWrite{
		{OffsetKey: k, Next: 11, Generation: 2, Last: 5, Floor: 10},
		{OffsetKey: k, Next: 13, Generation: 2, Floor: 10},
	} {
		if err := env.saveOffset(ctx, env.H.DB, w); err != nil {
			return fmt.Errorf("a write with floor %d on a row at or past it: %w", w.Floor, err)
		}
		if err := env.expectOffset(ctx, "after a write with a floor the row holds", row(k, w.Next, 2, w.Last)); err != nil {
			return err
		}
	}
	// A floor on a missing row: the row was deleted (a reset, a failover).
	missing := offKey("g", "orders", 1)
	err = env.saveOffset(ctx, env.H.DB, storage.OffsetWrite{OffsetKey: missing, Next: 4, Generation: 2, Floor: 3})
	if err := expectOffsetMoved("a write with a floor on a missing row", err); err != nil {
		return err
	}
	if err := env.expectOffset(ctx, "after the refused write of a missing row", row(missing, -1, 0, 0)); err != nil {
		return err
	}
	// Without a floor a write goes wherever the row stands, backwards
	// included (the inbox absorbs the redelivery).
	if err := env.saveOffset(ctx, env.H.DB, offWrite(k, 2, 2)); err != nil {
		return fmt.Errorf("a write without a floor, behind the row: %w", err)
	}
	return env.expectOffset(ctx, "after a write without a floor", row(k, 2, 2, 0))
}

// expectTakenOver checks that err is an *OffsetTakenOverError naming the
// row (its generation and offset) and the writer's generation.
func expectTakenOver(what string, err error, r storage.OffsetRow, mine int32) error {
	var te *storage.OffsetTakenOverError
	switch {
	case !errors.As(err, &te) || !errors.Is(err, storage.ErrOffsetTakenOver):
		return fmt.Errorf("%s: %v, want a *storage.OffsetTakenOverError wrapping storage.ErrOffsetTakenOver", what, err)
	case te.OffsetKey != r.OffsetKey || te.Generation != r.Generation || te.Next != r.Next || te.Mine != mine:
		return fmt.Errorf("%s: %+v, want the row's key, generation %d and offset %d, and the writer's generation %d", what, *te, r.Generation, r.Next, mine)
	}
	return nil
}

func checkOffsetsFence(ctx context.Context, env *Env) error {
	db := env.H.DB.WithContext(ctx)
	k := offKey("g", "orders", 0)
	if err := env.saveOffset(ctx, env.H.DB, storage.OffsetWrite{OffsetKey: k, Next: 10, Generation: 5, Last: 3, Floor: -1}); err != nil {
		return fmt.Errorf("first write: %w", err)
	}
	at5 := row(k, 10, 5, 3)
	for _, floor := range []int64{-1, 10} {
		err := env.saveOffset(ctx, env.H.DB, storage.OffsetWrite{OffsetKey: k, Next: 11, Generation: 4, Floor: floor})
		if err := expectTakenOver(fmt.Sprintf("an older generation's write (floor %d)", floor), err, at5, 4); err != nil {
			return err
		}
		if err := env.expectOffset(ctx, "after the older generation's write", at5); err != nil {
			return err
		}
	}
	// Claim: an older row is raised; a newer one is returned unchanged;
	// no row is not found.
	got, found, err := env.offsets().ClaimOffset(ctx, db, env.offsetsTable, k, 7)
	if err != nil || !found || got != row(k, 10, 7, 3) {
		return fmt.Errorf("ClaimOffset by generation 7 of a row of 5 = %+v, %v, %v; want the row at generation 7", got, found, err)
	}
	err = env.saveOffset(ctx, env.H.DB, storage.OffsetWrite{OffsetKey: k, Next: 11, Generation: 5, Floor: 10})
	if err := expectTakenOver("generation 5's write after generation 7 claimed the row", err, row(k, 10, 7, 3), 5); err != nil {
		return err
	}
	got, found, err = env.offsets().ClaimOffset(ctx, db, env.offsetsTable, k, 6)
	if err != nil || !found || got != row(k, 10, 7, 3) {
		return fmt.Errorf("ClaimOffset by generation 6 of a row of 7 = %+v, %v, %v; want the row unchanged", got, found, err)
	}
	if err := env.expectOffset(ctx, "after an older generation's claim", row(k, 10, 7, 3)); err != nil {
		return err
	}
	none := offKey("g", "orders", 9)
	if got, found, err = env.offsets().ClaimOffset(ctx, db, env.offsetsTable, none, 7); err != nil || found {
		return fmt.Errorf("ClaimOffset of a partition without a row = %+v, %v, %v; want not found", got, found, err)
	}
	if err := env.expectOffset(ctx, "after the claim of a partition without a row", row(none, -1, 0, 0)); err != nil {
		return err
	}
	// The claiming generation writes; an equal generation is no newer.
	if err := env.saveOffset(ctx, env.H.DB, storage.OffsetWrite{OffsetKey: k, Next: 12, Generation: 7, Last: 4, Floor: 10}); err != nil {
		return fmt.Errorf("the claiming generation's write: %w", err)
	}
	// Adopt: only from the generation given.
	if ok, err := env.offsets().AdoptOffset(ctx, db, env.offsetsTable, k, 6, 1); err != nil || ok {
		return fmt.Errorf("AdoptOffset from generation 6 of a row of 7 = %v, %v; want false", ok, err)
	}
	if err := env.expectOffset(ctx, "after a refused adoption", row(k, 12, 7, 4)); err != nil {
		return err
	}
	if ok, err := env.offsets().AdoptOffset(ctx, db, env.offsetsTable, k, 7, 1); err != nil || !ok {
		return fmt.Errorf("AdoptOffset from generation 7 of a row of 7 = %v, %v; want true", ok, err)
	}
	if err := env.expectOffset(ctx, "after the adoption", row(k, 12, 1, 4)); err != nil {
		return err
	}
	if ok, err := env.offsets().AdoptOffset(ctx, db, env.offsetsTable, k, 1, 1); err != nil || !ok {
		return fmt.Errorf("AdoptOffset from generation 1 to 1 of a row of 1 = %v, %v; want true", ok, err)
	}
	return env.saveOffset(ctx, env.H.DB, storage.OffsetWrite{OffsetKey: k, Next: 13, Generation: 1, Floor: 12})
}

func checkOffsetsSecondWaits(ctx context.Context, env *Env) error {
	other, done, err := env.otherPool(ctx)
	if err != nil {
		return err
	}
	defer done()
	for i, commit := range []bool{true, false} {
		k := offKey("g", "orders", int32(i))
		if err := env.saveOffset(ctx, env.H.DB, offWrite(k, 10, 1)); err != nil {
			return fmt.Errorf("first write: %w", err)
		}
		if err := offsetSecondWaits(ctx, env, other, k, commit); err != nil {
			return fmt.Errorf("the newer generation commits %v: %w", commit, err)
		}
	}
	return nil
}

func offsetSecondWaits(ctx context.Context, env *Env, other *gorm.DB, k storage.OffsetKey, commit bool) error {
	held, end, firstFinished := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var firstErr error
	go func() {
		defer close(firstFinished)
		firstErr = env.saveOffsetTx(ctx, env.H.DB, "", offWrite(k, 20, 3), func() error {
			close(held)
			<-end
			if commit {
				return nil
			}
			return errRollback
		})
	}()
	release := sync.OnceFunc(func() { close(end) })
	defer func() { release(); <-firstFinished }()
	select {
	case <-held:
	case <-firstFinished:
		return fmt.Errorf("the newer generation's write: %w", firstErr)
	}
	secondDone := make(chan error, 1)
	go func() {
		secondDone <- env.retried(ctx, func() error {
			return env.saveOffsetTx(ctx, other, "", storage.OffsetWrite{OffsetKey: k, Next: 11, Generation: 2, Floor: 10}, nil)
		})
	}()
	select {
	case err := <-secondDone:
		return fmt.Errorf("the older generation's write returned (%v) while the newer generation's transaction was writing the row: it did not wait for it", err)
	case <-time.After(holdFor):
	}
	release()
	<-firstFinished
	if firstErr != nil && (commit || !errors.Is(firstErr, errRollback)) {
		return fmt.Errorf("the newer generation's transaction: %w", firstErr)
	}
	var err error
	select {
	case err = <-secondDone:
	case <-ctx.Done():
		return ctx.Err()
	}
	if commit {
		if err := expectTakenOver("the older generation, after the newer one committed", err, row(k, 20, 3, 0), 2); err != nil {
			return err
		}
		return env.expectOffset(ctx, "after both", row(k, 20, 3, 0))
	}
	if err != nil {
		return fmt.Errorf("the older generation, after the newer one rolled back: %w", err)
	}
	return env.expectOffset(ctx, "after both", row(k, 11, 2, 0))
}

func checkOffsetsReset(ctx context.Context, env *Env) error {
	db := env.H.DB.WithContext(ctx)
	for _, w := range []storage.OffsetWrite{
		{OffsetKey: offKey("g", "orders", 0), Next: 10, Generation: 4, Last: 9, Floor: -1},
		{OffsetKey: offKey("g", "orders", 1), Next: 20, Generation: 4, Last: 19, Floor: -1},
		{OffsetKey: offKey("g", "billing", 0), Next: 30, Generation: 4, Last: 29, Floor: -1},
		{OffsetKey: offKey("h", "orders", 0), Next: 40, Generation: 4, Last: 39, Floor: -1},
	} {
		if err := env.saveOffset(ctx, env.H.DB, w); err != nil {
			return fmt.Errorf("write %+v: %w", w, err)
		}
	}
	if err := env.offsets().ResetOffsets(ctx, db, env.offsetsTable, "g", "orders", map[int32]int64{0: 3, 2: 7}); err != nil {
		return fmt.Errorf("ResetOffsets: %w", err)
	}
	for _, want := range []storage.OffsetRow{
		row(offKey("g", "orders", 0), 3, 4, 0),
		row(offKey("g", "orders", 1), 20, 4, 19),
		row(offKey("g", "orders", 2), 7, 0, 0),
		row(offKey("g", "billing", 0), 30, 4, 29),
		row(offKey("h", "orders", 0), 40, 4, 39),
	} {
		if err := env.expectOffset(ctx, "after the reset", want); err != nil {
			return err
		}
	}
	// The fence holds after a reset: the row's generation was kept.
	err := env.saveOffset(ctx, env.H.DB, storage.OffsetWrite{OffsetKey: offKey("g", "orders", 0), Next: 4, Generation: 3, Floor: 3})
	return expectTakenOver("an older generation's write after a reset", err, row(offKey("g", "orders", 0), 3, 4, 0), 3)
}

// firstLayout is the offsets table as the first version made it.
type firstLayout struct {
	GroupID    string `gorm:"column:group_id;primaryKey;size:255;not null"`
	Topic      string `gorm:"column:topic;primaryKey;size:249;not null"`
	Partition  int32  `gorm:"column:partition;primaryKey;autoIncrement:false;not null"`
	NextOffset int64  `gorm:"column:next_offset;not null"`
}

func checkOffsetsMigrate(ctx context.Context, env *Env) error {
	// Two tables: a new one, and one of the first layout with a row.
	old := env.offsetsTable + "_v1"
	if err := env.H.DB.WithContext(ctx).Table(old).Migrator().CreateTable(&firstLayout{}); err != nil {
		return fmt.Errorf("create a table of the first layout: %w", err)
	}
	defer func() { _ = env.H.DB.Migrator().DropTable(old) }()
	if err := env.H.DB.WithContext(ctx).Table(old).Create(&firstLayout{GroupID: "g", Topic: "orders", Partition: 2, NextOffset: 17}).Error; err != nil {
		return fmt.Errorf("a row of the first layout: %w", err)
	}
	const n = 4
	calls := make([]func() error, 0, 2*n)
	for i := range n {
		db, done, err := env.otherPool(ctx)
		if err != nil {
			return err
		}
		defer done()
		// Make the pool's connection now, so that the calls start together.
		if err := db.WithContext(ctx).Exec("SELECT 1").Error; err != nil {
			return fmt.Errorf("pool %d: %w", i, err)
		}
		for _, table := range []string{env.offsetsTable, old} {
			calls = append(calls, func() error { return env.offsets().MigrateOffsets(ctx, db.WithContext(ctx), table) })
		}
	}
	if err := atonce.Calls(calls...); err != nil {
		return fmt.Errorf("%d MigrateOffsets calls at once: %w", len(calls), err)
	}
	k := offKey("g", "orders", 0)
	if err := env.saveOffset(ctx, env.H.DB, storage.OffsetWrite{OffsetKey: k, Next: 5, Generation: 2, Last: 4, Floor: -1}); err != nil {
		return fmt.Errorf("a write after concurrent migration: %w", err)
	}
	again := func() error { return env.offsets().MigrateOffsets(ctx, env.H.DB.WithContext(ctx), env.offsetsTable) }
	if err := atonce.Calls(again, again); err != nil {
		return fmt.Errorf("MigrateOffsets on a migrated table: %w", err)
	}
	if err := env.expectOffset(ctx, "after MigrateOffsets ran again", row(k, 5, 2, 4)); err != nil {
		return err
	}
	// The first layout's row: readable, of no known generation or
	// fingerprint, and written on as any other.
	rows, err := env.offsets().Offsets(ctx, env.H.DB.WithContext(ctx), old, "g", "", -1)
	if want := []storage.OffsetRow{row(offKey("g", "orders", 2), 17, 0, 0)}; err != nil || !slices.Equal(rows, want) {
		return fmt.Errorf("the rows of an upgraded table of the first layout: %+v, %v; want %+v", rows, err, want)
	}
	w := storage.OffsetWrite{OffsetKey: offKey("g", "orders", 2), Next: 18, Generation: 1, Last: 6, Floor: 17}
	if err := env.retried(ctx, func() error {
		return env.H.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			return env.offsets().SaveOffset(ctx, tx, old, w)
		}, env.H.TxOptions)
	}); err != nil {
		return fmt.Errorf("a write on an upgraded table of the first layout: %w", err)
	}
	// A topic whose name differs only in letter case is another row, on
	// the upgraded table too (a table made with a case-folding collation).
	upper := storage.OffsetWrite{OffsetKey: offKey("g", "ORDERS", 2), Next: 3, Generation: 1, Floor: -1}
	if err := env.retried(ctx, func() error {
		return env.H.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			return env.offsets().SaveOffset(ctx, tx, old, upper)
		}, env.H.TxOptions)
	}); err != nil {
		return fmt.Errorf("a write of topic ORDERS beside orders on an upgraded table: %w", err)
	}
	rows, err = env.offsets().Offsets(ctx, env.H.DB.WithContext(ctx), old, "g", "", 2)
	if want := []storage.OffsetRow{row(upper.OffsetKey, 3, 1, 0), row(w.OffsetKey, 18, 1, 6)}; err != nil || !slices.Equal(rows, want) {
		return fmt.Errorf("after writes on an upgraded table: %+v, %v; want %+v", rows, err, want)
	}
	return nil
}
