package chaos

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/internal/backoff"
)

// The rewind phase (RunRewind): service A's database goes back in time
// while the orders come in, as a restore from a backup does. A backup
// copies A's tables (its orders, outbox A's rows, counters, marks and
// leases, source and epoch) with CREATE TABLE ... AS SELECT, A's writers
// held out meanwhile and A's relays stopped a moment before, so that it
// holds rows not yet published; a few seconds later, orders placed and
// published meanwhile, the tables are put back from it (DELETE and INSERT
// ... SELECT in one transaction). The restored counters hand out numbers
// again that the relays already published for other events, and the
// restored marks show as unpublished rows the relays already published:
// the relay must check the partitions, skip what is already there, and
// publish the rest under a new epoch (outbox/witness.go). Every other
// restore stops A's relays first and starts them after; the others keep
// them running through it.
//
// An order placed after a backup and taken out of A's table by the restore
// is the rewind's doing, not a loss of the library: if its OrderCreated
// was published before the restore it counts like any other order (B
// reserves it once, the ledger books it once); if it was not, nothing saw
// it and it is not counted (inventory.Chain.RolledBack), nor is the hole
// it leaves in its key's numbers counted as a reordering. The writers do
// not place such an order again: its event id would be published a
// second time, under another number, which only an inbox row per event
// could drop.

// RewindConfig sizes the rewind phase.
type RewindConfig struct {
	Orders  int           // orders service A places over the phase; default 1000
	Rewinds int           // restores of A's database; default 4
	Lease   time.Duration // the relays' lease; default 3 s
}

// Rewind is one backup and restore of service A's database, or one
// failover of it.
type Rewind struct {
	// RelaysRestarted: A's relays were stopped before the restore and
	// started after it; otherwise they ran through it.
	RelaysRestarted bool
	// Failover: the rewind was a failover to an asynchronous standby cut
	// off at Backup.Taken (the primary's WAL senders stopped), the primary
	// killed and the standby promoted at the restore's time. Backup then
	// says what the standby held when it was cut off, and Took is the time
	// from the kill until the promoted standby accepted writes.
	Failover bool
	Backup   inventory.ABackup
	// After is the time from the backup to the restore, in which orders
	// were placed and published.
	After time.Duration
	// Before and Kept are the orders A's table held just before the
	// restore and just after: Before-Kept were taken back.
	Before, Kept int64
	// EpochBefore is outbox A's epoch just before the restore (the
	// restore puts back Backup.Epoch).
	EpochBefore int64
	Took        time.Duration // the restore's transaction
}

// TakenBack is how many orders the restore took out of A's table.
func (r Rewind) TakenBack() int64 { return r.Before - r.Kept }

// RunRewind runs the rewind phase on cfg's database: the chain scenario
// (RunChain) with no kills, restarts or terminations, service A's database
// rewound rc.Rewinds times instead: restored from a backup, or, with
// cfg.StandbyDir (a PostgreSQL asynchronous standby, cfg.DSN over both
// servers, cfg.StoreOffsets), failed over (failoverOne). It checks what the chain run checks,
// over the orders the rewinds left to deliver (RewindConfig's doc), and
// that the relays logged that the database went back, at least once per
// restore, and no process logged an ERROR.
func RunRewind(ctx context.Context, cfg Config, rc RewindConfig) (*ChainReport, error) {
	cfg.Kills, cfg.BrokerRestarts, cfg.DBRestarts, cfg.Terminations = 0, 0, 0, 0
	if rc.Orders <= 0 {
		rc.Orders = 1000
	}
	if rc.Rewinds <= 0 {
		rc.Rewinds = 4
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 60 * time.Second
	}
	// Orders all along the phase, so that every restore is followed by
	// new ones: a wave every half second.
	cfg.Waves = max(cfg.Waves, int(cfg.Duration/(500*time.Millisecond)))
	return RunChain(ctx, cfg, ChainConfig{Orders: rc.Orders, Rewinds: rc.Rewinds, Lease: rc.Lease})
}

var relayA = chainRole{inventory.RoleRelay, inventory.StageOrders}

// rewinder makes the run's rewinds, spread over the chaos phase, one after
// the other: the first with A's relays restarted, then in turn.
func (c *chainRun) rewinder(ctx context.Context, driver inventory.Chain) error {
	n := c.cc.Rewinds
	if n == 0 {
		return nil
	}
	start := time.Now()
	for i := range n {
		// Room after the last one for orders that meet the restored
		// database.
		at := start.Add(c.cfg.Duration * time.Duration(i+1) / time.Duration(n+2))
		if backoff.Sleep(ctx, time.Until(at)) != nil {
			return ctx.Err()
		}
		rewind := c.rewindOne
		if c.standbyDir != "" {
			rewind = c.failoverOne
		}
		if err := rewind(ctx, driver, i+1, i%2 == 0); err != nil {
			return fmt.Errorf("rewind %d: %w", i+1, err)
		}
	}
	return nil
}

// rewindOne backs service A's database up and restores it a few seconds
// later.
func (c *chainRun) rewindOne(ctx context.Context, driver inventory.Chain, n int, restart bool) error {
	rw := Rewind{RelaysRestarted: restart}
	tag := strconv.Itoa(n)
	defer driver.DropBackupA(ctx, c.db, tag)
	gap := c.cfg.Duration / time.Duration(c.cc.Rewinds+2)
	// A backup with rows not yet published: A's relays stop while the
	// writers go on.
	ids := c.stopRole(relayA)
	c.waitUnpublished(ctx, driver, 5, 3*time.Second)
	c.placing.Lock()
	var err error
	rw.Backup, err = driver.BackupA(ctx, c.db, tag)
	c.placing.Unlock()
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := c.startRelays(ctx, ids); err != nil {
		return err
	}
	// Orders placed after the backup, published and applied downstream,
	// that the restore will take back.
	hold := min(max(gap/3, time.Second), 5*time.Second)
	if backoff.Sleep(ctx, hold) != nil {
		return ctx.Err()
	}
	pollUntil(ctx, 10*time.Second, 100*time.Millisecond, func(ctx context.Context) bool {
		placed, err := driver.PlacedOrders(ctx, c.db)
		return err == nil && int64(len(placed)) >= rw.Backup.Orders+10
	})
	if restart {
		// And orders the restore takes back before anything saw them.
		ids = c.stopRole(relayA)
		c.waitUnpublished(ctx, driver, 3, 2*time.Second)
	}
	c.placing.Lock()
	rw.EpochBefore, err = driver.Epoch(ctx, c.db)
	if err == nil {
		at := time.Now()
		rw.After = at.Sub(rw.Backup.Taken)
		rw.Before, rw.Kept, err = driver.RestoreA(ctx, c.db, tag)
		rw.Took = time.Since(at)
	}
	c.placing.Unlock()
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	c.mu.Lock()
	c.crep.Rewinds = append(c.crep.Rewinds, rw)
	c.mu.Unlock()
	c.lastRestore.Store(c.placed.Load())
	mode := "A's relays running through it"
	if restart {
		mode = "A's relays restarted"
	}
	c.say("chain: rewind %d (%s): restored the backup of %.1fs earlier (%d orders, %d rows unpublished, epoch %d): %d orders taken back, epoch %d -> %d, in %.2fs",
		n, mode, rw.After.Seconds(), rw.Backup.Orders, rw.Backup.Unpublished, rw.Backup.Epoch, rw.TakenBack(), rw.EpochBefore, rw.Backup.Epoch, rw.Took.Seconds())
	if restart {
		return c.startRelays(ctx, ids)
	}
	return nil
}

// failoverOne rewinds service A's database by a failover, as rewindOne
// does by a restore: with A's relays stopped until outbox A holds rows not
// yet published and the writers held out, the standby catches up with the
// primary and is cut off (the primary's WAL senders stopped); orders are
// placed, published and applied on the primary for a few seconds; the
// primary is killed (SIGKILL) and the standby promoted, the writers held
// out again; the killed primary then rejoins as the new standby. The whole
// database goes back, services B's and the ledger's tables too: their
// consumers must store their offsets (Config.Offsets.Store) to apply again
// what the promoted database lost.
func (c *chainRun) failoverOne(ctx context.Context, driver inventory.Chain, n int, restart bool) error {
	rw := Rewind{RelaysRestarted: restart, Failover: true}
	primary, standby := c.primaryDir, c.standbyDir
	pdb, err := c.openServer(primary)
	if err != nil {
		return err
	}
	defer closeDB(pdb)
	gap := c.cfg.Duration / time.Duration(c.cc.Rewinds+2)
	ids := c.stopRole(relayA)
	c.waitUnpublished(ctx, driver, 5, 3*time.Second)
	c.placing.Lock()
	rw.Backup, err = c.cutStandby(ctx, driver, pdb, primary, strconv.Itoa(n))
	c.placing.Unlock()
	if err != nil {
		return fmt.Errorf("cut the standby off: %w", err)
	}
	if err := c.startRelays(ctx, ids); err != nil {
		return err
	}
	hold := min(max(gap/3, time.Second), 5*time.Second)
	if backoff.Sleep(ctx, hold) != nil {
		return ctx.Err()
	}
	pollUntil(ctx, 10*time.Second, 100*time.Millisecond, func(ctx context.Context) bool {
		placed, err := driver.PlacedOrders(ctx, pdb)
		return err == nil && int64(len(placed)) >= rw.Backup.Orders+10
	})
	if restart {
		ids = c.stopRole(relayA)
		c.waitUnpublished(ctx, driver, 3, 2*time.Second)
	}
	c.placing.Lock()
	err = c.failOver(ctx, driver, pdb, primary, standby, &rw)
	c.placing.Unlock()
	if err != nil {
		return fmt.Errorf("fail over: %w", err)
	}
	c.mu.Lock()
	c.crep.Rewinds = append(c.crep.Rewinds, rw)
	c.mu.Unlock()
	c.lastRestore.Store(c.placed.Load())
	mode := "A's relays running through it"
	if restart {
		mode = "A's relays restarted"
	}
	c.say("chain: rewind %d by failover (%s): promoted the standby cut off %.1fs earlier (%d orders, %d rows unpublished, epoch %d): %d orders taken back, epoch %d -> %d, promoted in %.2fs",
		n, mode, rw.After.Seconds(), rw.Backup.Orders, rw.Backup.Unpublished, rw.Backup.Epoch, rw.TakenBack(), rw.EpochBefore, rw.Backup.Epoch, rw.Took.Seconds())
	if restart {
		if err := c.startRelays(ctx, ids); err != nil {
			return err
		}
	}
	if err := c.script(ctx, "postgres.sh", "rejoin", primary, standby, c.cfg.Replication); err != nil {
		return err
	}
	c.primaryDir, c.standbyDir = standby, primary
	return nil
}

// cutStandby waits until the standby replayed all that the primary (pdb,
// in dir) committed, records what it then holds, and stops the primary's
// WAL senders. The caller holds A's writers out.
func (c *chainRun) cutStandby(ctx context.Context, driver inventory.Chain, pdb *gorm.DB, dir, tag string) (inventory.ABackup, error) {
	b := inventory.ABackup{Tag: tag}
	placed, err := driver.PlacedOrders(ctx, pdb)
	if err != nil {
		return b, err
	}
	b.Orders = int64(len(placed))
	if b.Unpublished, err = driver.Unpublished(ctx, pdb, inventory.StageOrders); err != nil {
		return b, err
	}
	if b.Epoch, err = driver.Epoch(ctx, pdb); err != nil {
		return b, err
	}
	var lsn string
	if err := pdb.WithContext(ctx).Raw(`SELECT pg_current_wal_lsn()::text`).Scan(&lsn).Error; err != nil {
		return b, err
	}
	replayed := pollUntil(ctx, 30*time.Second, 20*time.Millisecond, func(ctx context.Context) bool {
		var n int64
		err := pdb.WithContext(ctx).Raw(`SELECT COUNT(*) FROM pg_stat_replication WHERE replay_lsn >= ?::pg_lsn`, lsn).Scan(&n).Error
		return err == nil && n > 0
	})
	if !replayed {
		return b, fmt.Errorf("the standby did not replay the primary's WAL up to %s in 30 s", lsn)
	}
	b.Taken = time.Now()
	return b, c.script(ctx, "postgres.sh", "pause-wal", dir)
}

// failOver kills the primary (pdb, in primary) and promotes the standby,
// and records the orders A's table held before and after. The caller holds
// A's writers out.
func (c *chainRun) failOver(ctx context.Context, driver inventory.Chain, pdb *gorm.DB, primary, standby string, rw *Rewind) error {
	var err error
	if rw.EpochBefore, err = driver.Epoch(ctx, pdb); err != nil {
		return err
	}
	placed, err := driver.PlacedOrders(ctx, pdb)
	if err != nil {
		return err
	}
	rw.Before = int64(len(placed))
	killed := time.Now()
	rw.After = killed.Sub(rw.Backup.Taken)
	if err := c.script(ctx, "postgres.sh", "kill", primary); err != nil {
		return err
	}
	if err := c.script(ctx, "postgres.sh", "promote", standby); err != nil {
		return err
	}
	rw.Took = time.Since(killed)
	// The driver's idle connections went with the primary; new ones reach
	// the promoted standby through the multi-host DSN.
	if sqlDB, err := c.db.DB(); err == nil {
		sqlDB.SetMaxIdleConns(0)
		sqlDB.SetMaxIdleConns(2)
	}
	sdb, err := c.openServer(standby)
	if err != nil {
		return err
	}
	defer closeDB(sdb)
	if placed, err = driver.PlacedOrders(ctx, sdb); err != nil {
		return err
	}
	rw.Kept = int64(len(placed))
	return nil
}

// waitUnpublished waits, at most max, until outbox A holds at least n rows
// not yet published.
func (c *chainRun) waitUnpublished(ctx context.Context, driver inventory.Chain, n int64, max time.Duration) {
	pollUntil(ctx, max, 50*time.Millisecond, func(ctx context.Context) bool {
		got, err := driver.Unpublished(ctx, c.db, inventory.StageOrders)
		return err == nil && got >= n
	})
}

// stopRole ends role's processes (SIGTERM, then SIGKILL after 30 s) and
// returns their relay ids.
func (c *chainRun) stopRole(role chainRole) []string {
	c.pmu.Lock()
	var stop, keep []*chainProc
	for _, p := range c.procs {
		if p.role == role {
			stop = append(stop, p)
		} else {
			keep = append(keep, p)
		}
	}
	c.procs = keep
	c.pmu.Unlock()
	var ids []string
	for _, p := range stop {
		ids = append(ids, p.relayID)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range stop {
		if reap(&p.proc, 30*time.Second) != nil {
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			_ = reap(&p.proc, 30*time.Second)
		}
	}
	return ids
}

// startRelays starts A's relays again under their ids.
func (c *chainRun) startRelays(ctx context.Context, ids []string) error {
	for _, id := range ids {
		if err := c.start(ctx, relayA, id); err != nil {
			return err
		}
	}
	return nil
}

// outboxesPublished reports whether the chain is at rest: outbox A
// published, B's group at the end of A's topic, outbox B published, the
// ledger's group at the end of B's topic, read in that order.
func (c *chainRun) outboxesPublished(ctx context.Context, driver inventory.Chain) bool {
	for _, g := range []struct{ outbox, stage, topic string }{
		{inventory.StageOrders, inventory.StageReserve, c.chain.OrdersTopic()},
		{inventory.StageReserve, inventory.StageLedger, c.chain.StockTopic()},
	} {
		n, err := driver.Unpublished(ctx, c.db, g.outbox)
		if err != nil || n > 0 {
			return false
		}
		p, err := inventory.GroupProgress(ctx, c.cfg.Brokers, c.groupOf(g.stage), g.topic, c.cfg.Partitions)
		if err != nil || !p.Done {
			return false
		}
	}
	return true
}

// verifyRewound is verify for a run with rewinds: the orders to check are
// those the rewinds left to deliver (inventory.Chain.RolledBack), the
// holes that the others leave in their keys' numbers are no reordering,
// and the relays must have said that the database went back.
func (c *chainRun) verifyRewound(ctx context.Context, driver inventory.Chain) error {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var err error
	c.crep.OrdersTopic, err = inventory.ScanTopic(sctx, c.cfg.Brokers, c.chain.OrdersTopic(), c.cfg.Partitions, nil)
	if err != nil {
		return fmt.Errorf("scan %s: %w", c.chain.OrdersTopic(), err)
	}
	check, sent, gone, err := driver.RolledBack(ctx, c.db, c.orders, func(o inventory.ChainEvent) bool {
		return c.crep.OrdersTopic.Published(inventory.EventIDs(inventory.StageOrders, []inventory.ChainEvent{o})[0])
	})
	if err != nil {
		return fmt.Errorf("chain check: %w", err)
	}
	c.crep.RolledBackSent, c.crep.RolledBackGone = sent, len(c.orders)-len(check)
	for attempt := 1; ; attempt++ {
		c.crep.Ledger, err = driver.CheckRewound(ctx, c.db, check, sent, gone)
		if err == nil || attempt == 5 || backoff.Sleep(ctx, time.Second) != nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("chain check: %w", err)
	}
	c.crep.Problems = append(c.crep.Problems, c.crep.Ledger.Problems()...)
	skip := func(key string, n int64) bool { return gone[key][n] }
	c.crep.OrdersTopic.Missing = c.crep.OrdersTopic.MissingOf(inventory.EventIDs(inventory.StageOrders, check))
	c.crep.OrdersTopic.Reordered = c.crep.OrdersTopic.ReorderedSkipping(skip)
	c.crep.StockTopic, err = inventory.ScanTopic(sctx, c.cfg.Brokers, c.chain.StockTopic(), c.cfg.Partitions, inventory.EventIDs(inventory.StageReserve, check))
	if err != nil {
		return fmt.Errorf("scan %s: %w", c.chain.StockTopic(), err)
	}
	c.crep.StockTopic.Reordered = c.crep.StockTopic.ReorderedSkipping(skip)
	c.crep.Problems = append(c.crep.Problems, c.crep.OrdersTopic.Problems("OrderCreated")...)
	c.crep.Problems = append(c.crep.Problems, c.crep.StockTopic.Problems("StockReserved")...)
	if c.crep.OrdersTopic.Missing > 0 {
		c.explainUnsent(ctx, driver, check)
	}
	if c.crep.Epoch, err = driver.Epoch(ctx, c.db); err != nil {
		return err
	}
	c.crep.Marks = c.marks.summary()
	c.crep.WentBack = c.marks.count("WARN", markWentBack)
	c.crep.LeaseLost = c.marks.count("", markLeaseLost)
	c.crep.OrdersAfterRewinds = int(c.placed.Load() - c.lastRestore.Load())
	add := func(cond bool, format string, args ...any) {
		if cond {
			c.crep.Problems = append(c.crep.Problems, fmt.Sprintf(format, args...))
		}
	}
	add(len(c.crep.Rewinds) < c.cc.Rewinds, "%d rewinds made of %d", len(c.crep.Rewinds), c.cc.Rewinds)
	for i, rw := range c.crep.Rewinds {
		add(rw.Backup.Unpublished == 0, "rewind %d: the backup held no unpublished row", i+1)
		add(rw.TakenBack() == 0, "rewind %d: the restore took no order back", i+1)
	}
	add(c.crep.OrdersAfterRewinds == 0, "no order placed after the last restore")
	add(c.crep.WentBack < len(c.crep.Rewinds), "%d relay lines saying the database went back, for %d restores", c.crep.WentBack, len(c.crep.Rewinds))
	add(c.marks.count("", markRetention) > 0, "%d relay lines saying retention deleted what they wanted to check", c.marks.count("", markRetention))
	add(c.crep.ErrorLines > 0, "%d ERROR lines (e.g. %s)", c.crep.ErrorLines, first(c.crep.ErrorKinds))
	return nil
}

// explainUnsent adds to the problems how many of the OrderCreated events
// never published lie at or below their shard's mark in outbox A: rows a
// relay's acknowledgement marked published though it never sent them.
func (c *chainRun) explainUnsent(ctx context.Context, driver inventory.Chain, check []inventory.ChainEvent) {
	var ids []string
	for _, id := range inventory.EventIDs(inventory.StageOrders, check) {
		if !c.crep.OrdersTopic.Published(id) {
			ids = append(ids, id)
		}
	}
	rows, marks, err := driver.UnsentBelowMark(ctx, c.db, inventory.StageOrders, ids)
	if err != nil {
		c.say("chain: cannot read outbox A's rows of the events never published: %v", err)
		return
	}
	var eg []string
	for _, r := range rows[:min(len(rows), 3)] {
		eg = append(eg, fmt.Sprintf("%s at shard %d seq %d, mark %d", r.EventID, r.Shard, r.Seq, marks[r.Shard]))
	}
	c.crep.Problems = append(c.crep.Problems, fmt.Sprintf("OrderCreated: %d of the %d events never published are at or below their shard's mark in outbox A: marked published, never sent (e.g. %s)",
		len(rows), len(ids), strings.Join(eg, "; ")))
}

// writeRewinds is the rewind part of a ChainReport.
func (r *ChainReport) writeRewinds(f func(string, ...any)) {
	restarted := 0
	for _, rw := range r.Rewinds {
		if rw.RelaysRestarted {
			restarted++
		}
	}
	how := "restores"
	if len(r.Rewinds) > 0 && r.Rewinds[0].Failover {
		how = "failovers"
	}
	f("  rewinds of A's database  %7d  %s (%d with A's relays restarted, %d with them running through it)", len(r.Rewinds), how, restarted, len(r.Rewinds)-restarted)
	for i, rw := range r.Rewinds {
		mode := "running through"
		if rw.RelaysRestarted {
			mode = "restarted"
		}
		if rw.Failover {
			f("      #%d relays %s: standby cut off with %d orders, %d rows unpublished, epoch %d; primary killed %.1fs later (epoch %d back to %d): %d orders taken back, promoted in %.2fs",
				i+1, mode, rw.Backup.Orders, rw.Backup.Unpublished, rw.Backup.Epoch, rw.After.Seconds(), rw.EpochBefore, rw.Backup.Epoch, rw.TakenBack(), rw.Took.Seconds())
			continue
		}
		f("      #%d relays %s: backup of %d orders, %d rows unpublished, epoch %d; restored %.1fs later (epoch %d back to %d): %d orders taken back, in %.2fs",
			i+1, mode, rw.Backup.Orders, rw.Backup.Unpublished, rw.Backup.Epoch, rw.After.Seconds(), rw.EpochBefore, rw.Backup.Epoch, rw.TakenBack(), rw.Took.Seconds())
	}
	f("  orders taken back        %7d  published before the restore (counted: reserved and booked once); %d never published (not counted)", r.RolledBackSent, r.RolledBackGone)
	f("  holes left by those      %7d  (events applied after a hole in their key's numbers; not counted as reordered)", r.Ledger.RewoundHoles)
	f("  database went back       %7d  relay Warn lines; %d epochs on A's topic; outbox A's epoch in its store at the end %d", r.WentBack, r.OrdersTopic.Epochs, r.Epoch)
	f("  acknowledgements refused %7d  relay Warn lines \"another relay took over shards\" (an acknowledgement after the restore, of rows the restored database no longer holds, or of a lease taken over)", r.LeaseLost)
	f("  orders after the last    %7d  restore", r.OrdersAfterRewinds)
	for _, m := range r.Marks {
		f("      %s", m)
	}
}

// RewindTable is the markdown table of docs/RELIABILITY.md's rewind section.
func RewindTable(reps []*ChainReport) string {
	var b strings.Builder
	b.WriteString("| database | orders | restores (relays restarted / running through) | rows unpublished in the backups | orders taken back (published before / never) | relay Warn \"database went back\" | acknowledgements refused | epochs on A's topic | copies published (OrderCreated / StockReserved) | duplicates dropped (B / ledger) | reserved | booked | lost (never booked) | applied twice | reordered | stream gaps | ERROR lines | restore (s) | wall time |\n")
	b.WriteString("|---|---:|---|---|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n")
	for _, r := range reps {
		restarted := 0
		var unpublished []string
		var took []time.Duration
		for _, rw := range r.Rewinds {
			if rw.RelaysRestarted {
				restarted++
			}
			unpublished = append(unpublished, strconv.FormatInt(rw.Backup.Unpublished, 10))
			took = append(took, rw.Took)
		}
		// An order lost anywhere on the way is never booked.
		lost := r.Ledger.BookLost
		fmt.Fprintf(&b, "| %s | %d | %d (%d / %d) | %s | %d (%d / %d) | %d | %d | %d | %d / %d | %d / %d | %d | %d | %d | %d | %d | %d | %d | %s | %.0fs |\n",
			r.Dialect, r.Orders, len(r.Rewinds), restarted, len(r.Rewinds)-restarted, strings.Join(unpublished, ", "),
			r.RolledBackSent+r.RolledBackGone, r.RolledBackSent, r.RolledBackGone, r.WentBack, r.LeaseLost, r.OrdersTopic.Epochs,
			r.OrdersTopic.Duplicates, r.StockTopic.Duplicates, r.DupSkipped[inventory.StageReserve], r.DupSkipped[inventory.StageLedger],
			r.Ledger.Reserved, r.Ledger.Booked, lost, r.Ledger.ReserveTwice+r.Ledger.BookTwice,
			r.Ledger.Reordered+int64(r.OrdersTopic.Reordered+r.StockTopic.Reordered),
			len(r.OrdersTopic.StreamGaps)+len(r.StockTopic.StreamGaps), r.ErrorLines, spreadOf(took), r.Wall.Seconds())
	}
	return b.String()
}
