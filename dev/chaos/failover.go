package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/internal/backoff"
)

// failover kills the PostgreSQL primary with SIGKILL under load, promotes
// its standby, and makes the killed primary the new standby. Before the
// kill the primary's WAL senders are paused for LagWindow, so that an
// asynchronous standby lacks the commits of that window (a lagging link)
// and a synchronous one holds them unacknowledged. It records what the
// promoted database lost and how long the consumers took to apply effects
// again.
func (r *run) failover(ctx context.Context) error {
	primary, standby := r.primaryDir, r.standbyDir
	if standby == "" {
		return r.skip("fail over: no standby left (a killed MariaDB primary does not rejoin)")
	}
	script := "postgres.sh"
	if r.cfg.Dialect == "mysql" {
		script = "mariadb.sh"
	}
	pdb, err := r.openServer(primary)
	if err != nil {
		return err
	}
	defer closeDB(pdb)
	busy := r.waitBusy(ctx, 5*time.Second)
	r.say("failover #%d: pausing replication for %v, then SIGKILL the primary (consumers busy: %v)",
		len(r.rep.FailoverStats)+1, r.cfg.LagWindow, busy)
	// PostgreSQL: the primary's WAL senders stop; MariaDB: the replica's IO
	// thread. Either way a synchronous primary holds its commits meanwhile.
	if r.cfg.Dialect == "mysql" {
		err = r.script(ctx, script, "pause-replication", standby)
	} else {
		err = r.script(ctx, script, "pause-wal", primary)
	}
	if err != nil {
		return err
	}
	// What the primary committed, as last seen before the kill. A commit
	// waiting for a synchronous standby is not visible to other sessions.
	seen := int64(-1)
	end := time.Now().Add(r.cfg.LagWindow)
	for time.Now().Before(end) {
		qctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		if n, err := r.backend.Reservations(qctx, pdb); err == nil {
			seen = n
		}
		cancel()
		if backoff.Sleep(ctx, 50*time.Millisecond) != nil {
			return ctx.Err()
		}
	}
	if err := r.script(ctx, script, "kill", primary); err != nil {
		return err
	}
	killed := time.Now()
	if err := r.script(ctx, script, "promote", standby); err != nil {
		return err
	}
	if r.proxy != nil {
		addr, err := serverAddr(standby)
		if err != nil {
			return err
		}
		r.proxy.switchTo(addr)
	}
	st := FailoverStat{Promote: time.Since(killed)}
	sdb, err := r.openServer(standby)
	if err != nil {
		return err
	}
	defer closeDB(sdb)
	after, err := r.backend.Reservations(ctx, sdb)
	if err != nil {
		return fmt.Errorf("chaos: count on the promoted standby: %w", err)
	}
	if seen > after {
		st.ServerLost = seen - after
	}
	if r.cfg.StoreOffsets {
		st.KafkaAhead = r.kafkaAhead(ctx, sdb)
	}

	// The old primary rejoins as the new standby while the consumers
	// reconnect; a synchronous new primary holds every commit until then.
	var wg sync.WaitGroup
	var rejoinErr error
	if r.cfg.Dialect == "postgres" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rejoinErr = r.script(ctx, script, "rejoin", primary, standby, r.cfg.Replication)
		}()
	}
	// Recovery is measured only while there is work: a failover after the
	// last wave may find nothing left to apply (Recovery -1).
	st.Recovery = -1
	for time.Since(killed) < recoveryLimit {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		n, err := r.backend.Reservations(qctx, sdb)
		cancel()
		if err == nil && n > after {
			st.Recovery = time.Since(killed)
			break
		}
		if backoff.Sleep(ctx, 20*time.Millisecond) != nil {
			break
		}
	}
	wg.Wait()
	if rejoinErr != nil {
		return rejoinErr
	}
	r.primaryDir, r.standbyDir = standby, primary
	if r.cfg.Dialect == "mysql" {
		r.standbyDir = ""
	}
	r.mu.Lock()
	r.rep.FailoverStats = append(r.rep.FailoverStats, st)
	n := len(r.rep.FailoverStats)
	r.mu.Unlock()
	recovery := "none pending"
	if st.Recovery >= 0 {
		recovery = fmt.Sprintf("%.2fs", st.Recovery.Seconds())
	}
	r.say("failover #%d done: promoted in %.2fs, effects applied again after the kill: %s; the promoted database lacks at least %d effects the old primary had committed; the group's Kafka offsets were %d messages past its stored positions",
		n, st.Promote.Seconds(), recovery, st.ServerLost, st.KafkaAhead)
	return nil
}

// recoveryLimit bounds the wait for the first effect after a failover.
const recoveryLimit = 20 * time.Second

// openServer connects to the one server of a service dir, not through the
// consumers' multi-host DSN.
func (r *run) openServer(dir string) (*gorm.DB, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "dsn"))
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	b := r.backend
	b.DSN = strings.TrimSpace(string(raw))
	if r.cfg.Dialect == "mysql" {
		b.DSN += "&timeout=5s"
	} else {
		b.DSN += " connect_timeout=5"
	}
	db, _, err := b.Open()
	return db, err
}

// serverAddr is the host:port of the MariaDB server of a service dir.
func serverAddr(dir string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "dsn"))
	if err != nil {
		return "", fmt.Errorf("chaos: %w", err)
	}
	mc, err := gomysql.ParseDSN(strings.TrimSpace(string(raw)))
	if err != nil {
		return "", fmt.Errorf("chaos: %s/dsn: %w", dir, err)
	}
	return mc.Addr, nil
}

// startProxy starts the proxy to the server of dsn and returns dsn with the
// proxy's address instead.
func (r *run) startProxy(dsn string) (string, error) {
	mc, err := gomysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("chaos: mysql DSN: %w", err)
	}
	if r.proxy, err = newProxy(mc.Addr); err != nil {
		return "", err
	}
	mc.Addr = r.proxy.addr()
	return mc.FormatDSN(), nil
}

// kafkaAhead sums, over the partitions, how far the group's committed
// offset in Kafka is past the offset stored in db.
func (r *run) kafkaAhead(ctx context.Context, db *gorm.DB) int64 {
	p, err := inventory.GroupProgress(ctx, r.cfg.Brokers, r.group, r.topic, r.cfg.Partitions)
	if err != nil {
		r.say("cannot read the group's offsets: %v", err)
		return 0
	}
	stored, err := r.backend.StoredOffsets(ctx, db, r.group, r.topic)
	if err != nil {
		r.say("cannot read the stored offsets: %v", err)
		return 0
	}
	var ahead int64
	for part, committed := range p.Offsets {
		if s, ok := stored[part]; ok && committed > s {
			ahead += committed - s
		}
	}
	return ahead
}

// storedAtEnd reports whether the database's stored offset of every
// partition is at its log end.
func (r *run) storedAtEnd(ctx context.Context, ends map[int]int64) bool {
	stored, err := r.backend.StoredOffsets(ctx, r.db, r.group, r.topic)
	if err != nil {
		return false
	}
	for part, end := range ends {
		if stored[part] < end {
			return false
		}
	}
	return true
}

// fmtDurations is "median m (min..max)" of seconds.
func fmtDurations(s []float64) string {
	if len(s) == 0 {
		return "-"
	}
	s = slices.Clone(s)
	slices.Sort(s)
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
	return fmt.Sprintf("median %s (%s..%s)", f(s[len(s)/2]), f(s[0]), f(s[len(s)-1]))
}
