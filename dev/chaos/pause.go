package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/internal/backoff"
)

// The pause phase (RunPause): the chain's relays and consumers are stopped
// with SIGSTOP past their lease and session timeout, as a GC pause, a
// frozen VM or a stopped container does, and let go on later. A paused
// consumer is dropped from its group and its partitions move; when it goes
// on it is a zombie until it learns that its generation is over: its
// transaction in flight, its stored offset's write and its Kafka commit
// must do no harm. A paused relay resumes after its lease expired, when
// another relay may have taken its shards over.

// Pause is one SIGSTOP of a chain process.
type Pause struct {
	Process string
	Role    string        // the process's role, as in ChainReport.KillsByRole
	For     time.Duration // from SIGSTOP to SIGCONT
	// Open is how many transactions the process held open on the server
	// while it was stopped (-1: the server could not be asked).
	Open int
	// Tries is how many times the process was stopped (and at once let go
	// on again) until it was stopped inside a transaction; 1 for a pause
	// that did not seek one.
	Tries int
	Busy  bool // the role had work in hand
}

// seekFor bounds the time spent stopping a process again and again (or
// freezing its link) to find it inside a transaction.
const seekFor = 15 * time.Second

// PauseConfig sizes the pause phase.
type PauseConfig struct {
	Orders   int           // orders service A places; default 1000
	Pauses   int           // SIGSTOPs per run, spread over the roles; default 12
	PauseFor time.Duration // see ChainConfig.PauseFor
	Lease    time.Duration // the relays' lease; default 3 s
}

// RunPause runs the pause phase on cfg's database: the chain scenario
// (RunChain) with no kills, restarts or terminations, its relays and
// consumers paused instead (ChainConfig.Pauses), with the consumers'
// StoreOffsets as cfg says. It checks what the chain run checks, and that
// no stored offset ever went back, every one ended at its log end, and no
// message was charged an attempt.
func RunPause(ctx context.Context, cfg Config, pc PauseConfig) (*ChainReport, error) {
	if cfg.Dialect == "sqlite" {
		return nil, errors.New("chaos: the pause phase needs a database server (it asks which paused process holds a transaction open)")
	}
	cfg.Kills, cfg.BrokerRestarts, cfg.DBRestarts, cfg.Terminations = 0, 0, 0, 0
	if pc.Orders <= 0 {
		pc.Orders = 1000
	}
	if pc.Pauses <= 0 {
		pc.Pauses = 12
	}
	return RunChain(ctx, cfg, ChainConfig{Orders: pc.Orders, Pauses: pc.Pauses, PauseFor: pc.PauseFor, Lease: pc.Lease})
}

func (c *chainRun) pauseFor() time.Duration {
	if c.cc.PauseFor > 0 {
		return c.cc.PauseFor
	}
	return 2 * max(c.cfg.Session, c.cc.Lease)
}

// pauser makes the run's pauses: the roles take them in turn, each role's
// spread over the chaos phase, the roles' concurrently.
func (c *chainRun) pauser(ctx context.Context) error {
	if c.cc.Pauses == 0 {
		return nil
	}
	per := map[chainRole]int{}
	for i := range c.cc.Pauses {
		per[chainRoles[i%len(chainRoles)]]++
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(chainRoles))
	for _, role := range chainRoles {
		if n := per[role]; n > 0 {
			wg.Go(func() { errs <- c.pauseRole(ctx, role, n) })
		}
	}
	wg.Wait()
	close(errs)
	var err error
	for e := range errs {
		err = errors.Join(err, e)
	}
	return err
}

// pauseRole makes n pauses of role's processes, every other one inside a
// transaction.
func (c *chainRun) pauseRole(ctx context.Context, role chainRole, n int) error {
	// The pauses share the phase with the gaps before, between and after
	// them (a pause lasts 1.5 PauseFor on average), so that they fall
	// while the orders come in.
	gap := (c.cfg.Duration - time.Duration(n)*c.pauseFor()*3/2) / time.Duration(n+1)
	gap = max(gap, 500*time.Millisecond)
	for j := range n {
		if backoff.Sleep(ctx, c.jitter(gap)) != nil {
			return ctx.Err()
		}
		if err := c.pauseOne(ctx, role, j%2 == 0); err != nil {
			return err
		}
	}
	return nil
}

// pauseOne stops a random process of role with SIGSTOP, for PauseFor to
// twice that, and lets it go on with SIGCONT. With inTx it seeks a moment
// when the process holds a transaction open on the server: stopped at a
// random moment outside one, it is let go on at once and stopped again a
// few milliseconds later, for at most seekFor.
func (c *chainRun) pauseOne(ctx context.Context, role chainRole, inTx bool) error {
	busy := c.waitBusy(ctx, role, 3*time.Second)
	c.pmu.Lock()
	var of []*chainProc
	for _, p := range c.procs {
		if p.role == role {
			of = append(of, p)
		}
	}
	if len(of) == 0 {
		c.pmu.Unlock()
		return nil
	}
	p := of[c.intn(len(of))]
	c.pmu.Unlock()

	proc := p.cmd.Process
	pause := Pause{Process: p.name, Role: role.label(), Open: -1, Busy: busy}
	defer func() { _ = proc.Signal(syscall.SIGCONT) }()
	seekUntil := time.Now().Add(seekFor)
	for {
		pause.Tries++
		if err := proc.Signal(syscall.SIGSTOP); err != nil {
			return nil // it ended meanwhile (replaced by the supervisor)
		}
		waitStopped(proc.Pid)
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		n, err := c.inTransaction(qctx, proc.Pid)
		cancel()
		pause.Open = -1
		if err == nil {
			pause.Open = n
		}
		if !inTx || pause.Open > 0 || time.Now().After(seekUntil) || ctx.Err() != nil {
			break
		}
		_ = proc.Signal(syscall.SIGCONT)
		if backoff.Sleep(ctx, time.Duration(2+c.intn(20))*time.Millisecond) != nil {
			return ctx.Err()
		}
	}
	stopped := time.Now()
	d := c.pauseFor() + time.Duration(c.intn(int(c.pauseFor()/time.Millisecond)))*time.Millisecond
	c.say("chain: SIGSTOP %s for %.1fs (%s; %d transactions open on the server; %d stops to find one)",
		p.name, d.Seconds(), map[bool]string{true: "busy", false: "idle"}[busy], pause.Open, pause.Tries)
	err := backoff.Sleep(ctx, d)
	_ = proc.Signal(syscall.SIGCONT)
	pause.For = time.Since(stopped)
	c.say("chain: SIGCONT %s after %.1fs", p.name, pause.For.Seconds())
	c.mu.Lock()
	c.crep.Pauses = append(c.crep.Pauses, pause)
	c.mu.Unlock()
	if err != nil {
		return ctx.Err()
	}
	return nil
}

// waitStopped waits, at most 200 ms, until the kernel reports process pid
// stopped (state T): SIGSTOP is delivered asynchronously.
func waitStopped(pid int) {
	path := filepath.Join("/proc", strconv.Itoa(pid), "stat")
	for range 200 {
		raw, err := os.ReadFile(path)
		if err != nil {
			return
		}
		// pid (comm) state ...: comm may hold spaces and parentheses.
		if i := strings.LastIndexByte(string(raw), ')'); i >= 0 && i+2 < len(raw) && (raw[i+2] == 'T' || raw[i+2] == 't') {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// consumingStages are the chain's groups: a stage and the topic it reads.
func (c *chainRun) consumingStages() []struct{ stage, topic string } {
	return []struct{ stage, topic string }{
		{inventory.StageReserve, c.chain.OrdersTopic()}, {inventory.StageLedger, c.chain.StockTopic()},
	}
}

// sampleOffsets reads both groups' stored offsets every 100 ms until ctx
// ends, and records every reading of a partition below an earlier one:
// with no failover in the run, a stored offset that goes back means a
// member wrote an older position over a newer one.
func (c *chainRun) sampleOffsets(ctx context.Context) {
	if !c.cfg.StoreOffsets {
		return
	}
	highest := map[string]int64{}
	for {
		for _, g := range c.consumingStages() {
			qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			got, err := inventory.StoredOffsets(qctx, c.db, c.chain.OffsetsTable(g.stage), c.groupOf(g.stage), g.topic)
			cancel()
			if err != nil {
				continue // the consumers have not made the table yet, or ctx ended
			}
			c.mu.Lock()
			c.crep.OffsetSamples++
			for part, next := range got {
				key := fmt.Sprintf("%s/%d", g.stage, part)
				prev, seen := highest[key]
				if seen && next < prev {
					c.crep.OffsetsBack = append(c.crep.OffsetsBack, fmt.Sprintf("%s: %d read after %d", key, next, prev))
				}
				if !seen || next > prev {
					highest[key] = next
				}
			}
			c.mu.Unlock()
		}
		if backoff.Sleep(ctx, 100*time.Millisecond) != nil {
			return
		}
	}
}

// stageStoredAtEnd reports whether a stage's stored offset of every
// partition is at its log end.
func (c *chainRun) stageStoredAtEnd(ctx context.Context, stage, topic string, ends map[int]int64) bool {
	stored, err := inventory.StoredOffsets(ctx, c.db, c.chain.OffsetsTable(stage), c.groupOf(stage), topic)
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

// judgePauses adds to the chain run's checks: no stored offset gone back;
// in a pause run also no message charged anything (the scenario has no
// poison, so every attempt charged, dead letter or stopped partition was
// caused by a pause), no message logged as failed at Error, and pauses
// that really held transactions open.
func (c *chainRun) judgePauses() error {
	c.crep.Marks = c.marks.summary()
	c.crep.Fenced = c.marks.count("", markFenced)
	c.crep.LeaseLost = c.marks.count("", markLeaseLost)
	traces, err := filepath.Glob(filepath.Join(c.cfg.WorkDir, "*.trace"))
	if err != nil {
		return err
	}
	slices.Sort(traces)
	for _, path := range traces {
		trace, err := inventory.ReadTrace(path)
		if err != nil {
			return err
		}
		for _, e := range inventory.Charged(trace) {
			c.crep.Charged = append(c.crep.Charged, strings.TrimSuffix(filepath.Base(path), ".trace")+": "+e.String())
		}
	}
	add := func(cond bool, format string, args ...any) {
		if cond {
			c.crep.Problems = append(c.crep.Problems, fmt.Sprintf(format, args...))
		}
	}
	add(len(c.crep.OffsetsBack) > 0, "stored offsets went back %d times (e.g. %s)", len(c.crep.OffsetsBack), first(c.crep.OffsetsBack))
	if c.cc.Pauses == 0 {
		return nil
	}
	add(len(c.crep.Charged) > 0, "%d attempts, dead letters or stopped partitions charged to healthy messages (e.g. %s)", len(c.crep.Charged), first(c.crep.Charged))
	add(c.marks.count("ERROR", markMessageFailed) > 0, "%d healthy messages logged as failed at Error", c.marks.count("ERROR", markMessageFailed))
	inTx := 0
	for _, p := range c.crep.Pauses {
		if p.Open > 0 {
			inTx++
		}
	}
	add(len(c.crep.Pauses) < c.cc.Pauses, "%d pauses made of %d", len(c.crep.Pauses), c.cc.Pauses)
	add(inTx == 0, "no pause found its process inside a transaction")
	add(c.cfg.StoreOffsets && c.crep.OffsetSamples == 0, "the stored offsets were never read")
	return nil
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// writePauses is the pause part of a ChainReport.
func (r *ChainReport) writePauses(f func(string, ...any)) {
	var lengths []float64
	byRole, inTx := map[string]int{}, map[string]int{}
	for _, p := range r.Pauses {
		lengths = append(lengths, p.For.Seconds())
		byRole[p.Role]++
		if p.Open > 0 {
			inTx[p.Role]++
		}
	}
	f("  StoreOffsets             %7v", r.StoreOffsets)
	f("  SIGSTOPs                 %7d  (%s)", len(r.Pauses), fmtRoles(byRole))
	f("  inside a transaction     %7d  (%s)", sum(inTx), fmtRoles(inTx))
	f("  paused for (s)           %s", fmtDurations(lengths))
	f("  zombie workers fenced    %7d  (Warn: partition taken over by a newer generation)", r.Fenced)
	f("  relay leases lost        %7d  (Warn: another relay took over shards)", r.LeaseLost)
	if r.StoreOffsets {
		f("  stored offsets read      %7d  rounds; went back %d times", r.OffsetSamples, len(r.OffsetsBack))
		for _, s := range r.OffsetsBack[:min(len(r.OffsetsBack), 5)] {
			f("      %s", s)
		}
	}
	f("  charged to messages      %7d  (attempts, dead letters, stopped partitions)", len(r.Charged))
	for _, s := range r.Charged[:min(len(r.Charged), 5)] {
		f("      %s", s)
	}
	for _, m := range r.Marks {
		f("      %s", m)
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// PauseTable is the markdown table of docs/RELIABILITY.md's pause section.
func PauseTable(reps []*ChainReport) string {
	var b strings.Builder
	b.WriteString("| database | StoreOffsets | orders | SIGSTOPs (relays / consumers) | inside a transaction (relays / consumers) | paused for (s) | zombie workers fenced | relay leases lost | copies published (OrderCreated / StockReserved) | duplicates dropped (B / ledger) | stored offsets read / went back | reserved | booked | lost | applied twice | reordered | attempts charged | ERROR lines | wall time |\n")
	b.WriteString("|---|---|---:|---|---|---|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range reps {
		var relays, consumers, relaysTx, consumersTx int
		var lengths []time.Duration
		for _, p := range r.Pauses {
			lengths = append(lengths, p.For)
			relay := strings.HasPrefix(p.Role, inventory.RoleRelay)
			switch {
			case relay:
				relays++
			default:
				consumers++
			}
			if p.Open > 0 && relay {
				relaysTx++
			} else if p.Open > 0 {
				consumersTx++
			}
		}
		offs := "-"
		if r.StoreOffsets {
			offs = fmt.Sprintf("%d / %d", r.OffsetSamples, len(r.OffsetsBack))
		}
		lost := r.Ledger.ReserveLost + r.Ledger.BookLost + int64(r.OrdersTopic.Missing+r.StockTopic.Missing)
		fmt.Fprintf(&b, "| %s | %v | %d | %d (%d / %d) | %d (%d / %d) | %s | %d | %d | %d / %d | %d / %d | %s | %d | %d | %d | %d | %d | %d | %d | %.0fs |\n",
			r.Dialect, r.StoreOffsets, r.Orders, len(r.Pauses), relays, consumers, relaysTx+consumersTx, relaysTx, consumersTx,
			spreadOf(lengths), r.Fenced, r.LeaseLost, r.OrdersTopic.Duplicates, r.StockTopic.Duplicates,
			r.DupSkipped[inventory.StageReserve], r.DupSkipped[inventory.StageLedger], offs, r.Ledger.Reserved, r.Ledger.Booked, lost,
			r.Ledger.ReserveTwice+r.Ledger.BookTwice, r.Ledger.Reordered+int64(r.OrdersTopic.Reordered+r.StockTopic.Reordered),
			len(r.Charged), r.ErrorLines, r.Wall.Seconds())
	}
	return b.String()
}

// spreadOf is "median (min..max)" in seconds.
func spreadOf(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return fmt.Sprintf("%.1f (%.1f..%.1f)", ds[len(ds)/2].Seconds(), ds[0].Seconds(), ds[len(ds)-1].Seconds())
}
