package main

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/inboxgo/inbox/dev/inventory"
)

// chainOrders is how many orders the chain part places: enough to show
// the kills, few enough to keep the demo within seconds.
const chainOrders = 300

// chainProc is one relay or consumer process of the chain part.
type chainProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

// runChain is the second part of the demo, the outbox chain: service A
// places orders and enqueues OrderCreated in each order's transaction;
// relay A publishes them; service B reserves stock, deduplicating by the
// watermark of each stream of A's aligned outbox (sequenced dedup), and
// enqueues StockReserved in the same transaction; relay B publishes those;
// a ledger books them through its inbox rows. Relay A kills
// itself right after the broker acknowledged its third batch, before
// marking it published (the relay that takes over finds that batch in the
// partitions and marks it without sending it again), and B's consumer
// is killed with SIGKILL mid-stream. The same checks as the chaos run's
// chain phase follow.
func (d *demo) runChain(ctx context.Context) (bool, error) {
	start := time.Now()
	chain := inventory.Chain{Backend: d.backend, Partitions: d.partitions}
	log := slog.New(slog.NewTextHandler(d.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := chain.Setup(ctx, d.db, inventory.SKUs, log); err != nil {
		return false, fmt.Errorf("chain setup: %w", err)
	}
	if !d.keep {
		defer chain.Drop(ctx, d.db)
	}
	if !d.inProcess {
		for _, topic := range []string{chain.OrdersTopic(), chain.StockTopic()} {
			if err := inventory.CreateTopic(ctx, d.brokers[0], topic, d.partitions); err != nil {
				return false, err
			}
		}
	}
	obA, err := chain.NewOutbox(d.db, inventory.StageOrders, log)
	if err != nil {
		return false, err
	}
	var procs []*chainProc
	defer func() { stopChain(procs) }()
	startProc := func(name, role, stage string, crashAfter int) error {
		cmd, err := inventory.StartChainProcess(ctx, inventory.ChainProcessConfig{
			Chain: chain, Role: role, Stage: stage, Name: name, Brokers: d.brokers,
			RelayID: "demo-" + role + "-" + stage, Lease: 2 * time.Second, CrashAfter: crashAfter,
			Group: "chain-" + stage + "-" + d.backend.RunID, Session: d.session,
			EventLog: filepath.Join(d.dir, "chain-"+stage+".log"),
		}, d.childOut)
		if err != nil {
			return err
		}
		p := &chainProc{name: name, cmd: cmd, done: make(chan struct{})}
		go func() { _ = cmd.Wait(); close(p.done) }()
		procs = append(procs, p)
		return nil
	}

	d.say("")
	d.say("[6/7] the outbox chain: A -> relay A -> B (watermarks + outbox) -> relay B -> ledger (inbox rows)")
	d.say("      service A places %d orders over %d SKUs, each with its OrderCreated in the same transaction", chainOrders, len(inventory.SKUs))
	for _, p := range []struct {
		name, role, stage string
		crash             int
	}{
		{"relay-a-1", inventory.RoleRelay, inventory.StageOrders, 3},
		{"consumer-b-1", inventory.RoleConsumer, inventory.StageReserve, 0},
		{"relay-b", inventory.RoleRelay, inventory.StageReserve, 0},
		{"ledger", inventory.RoleConsumer, inventory.StageLedger, 0},
	} {
		if err := startProc(p.name, p.role, p.stage, p.crash); err != nil {
			return false, err
		}
	}
	orders := inventory.ChainOrders(d.backend.RunID, chainOrders, inventory.SKUs)
	placed := make(chan error, 1)
	go func() {
		for _, o := range orders {
			if err := chain.PlaceOrder(ctx, d.db, obA, o); err != nil {
				placed <- err
				return
			}
		}
		placed <- nil
	}()

	// Relay A dies right after the broker acknowledged its third batch; a
	// new relay under the same id resumes its shards at once.
	relayA := procs[0]
	select {
	case <-relayA.done:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	d.say("      relay A killed itself (SIGKILL) after the broker acknowledged a batch, before marking it published")
	if err := startProc("relay-a-2", inventory.RoleRelay, inventory.StageOrders, 0); err != nil {
		return false, err
	}
	if err := d.poll(ctx, func() (bool, string, error) {
		n, err := chain.Reserved(ctx, d.db)
		return n >= chainOrders*40/100, fmt.Sprintf("%d/%d orders reserved by B", n, chainOrders), err
	}); err != nil {
		return false, err
	}
	consumerB := procs[1]
	_ = consumerB.cmd.Process.Signal(syscall.SIGKILL)
	<-consumerB.done
	n, err := chain.Reserved(ctx, d.db)
	if err != nil {
		return false, err
	}
	d.say("      consumer B killed with SIGKILL after %d reservations; consumer B #2 takes over", n)
	if err := startProc("consumer-b-2", inventory.RoleConsumer, inventory.StageReserve, 0); err != nil {
		return false, err
	}
	if err := <-placed; err != nil {
		return false, err
	}
	if err := d.poll(ctx, func() (bool, string, error) {
		n, err := chain.Booked(ctx, d.db)
		if err != nil || n < chainOrders {
			return false, fmt.Sprintf("%d/%d StockReserved booked by the ledger", n, chainOrders), err
		}
		for _, g := range []struct{ stage, topic string }{
			{inventory.StageReserve, chain.OrdersTopic()}, {inventory.StageLedger, chain.StockTopic()},
		} {
			p, err := inventory.GroupProgress(ctx, d.brokers, "chain-"+g.stage+"-"+d.backend.RunID, g.topic, d.partitions)
			if err != nil || !p.Done {
				return false, "waiting for the groups' commits", nil
			}
		}
		return true, "", nil
	}); err != nil {
		return false, err
	}
	stopChain(procs)
	procs = nil

	d.say("[7/7] verifying the chain")
	ledger, err := chain.Check(ctx, d.db, orders)
	if err != nil {
		return false, err
	}
	created, err := inventory.ScanTopic(ctx, d.brokers, chain.OrdersTopic(), d.partitions, inventory.EventIDs(inventory.StageOrders, orders))
	if err != nil {
		return false, err
	}
	reserved, err := inventory.ScanTopic(ctx, d.brokers, chain.StockTopic(), d.partitions, inventory.EventIDs(inventory.StageReserve, orders))
	if err != nil {
		return false, err
	}
	outcomes := map[string]inventory.Outcomes{}
	var problems []string
	for _, stage := range []string{inventory.StageReserve, inventory.StageLedger} {
		out, err := inventory.CountOutcomes(filepath.Join(d.dir, "chain-"+stage+".log"))
		if err != nil {
			return false, err
		}
		outcomes[stage] = out
		problems = append(problems, out.PathProblems(stage)...)
	}
	b, l := outcomes[inventory.StageReserve], outcomes[inventory.StageLedger]
	d.say("")
	d.say("  orders placed by A     %7d", ledger.Placed)
	d.say("  OrderCreated in topic  %7d  (%d distinct, %d published again: the relay after the crash found what its predecessor had sent in the partitions, and marked it without sending it again)",
		created.Messages, created.Distinct, created.Duplicates)
	d.say("  StockReserved in topic %7d  (%d distinct, %d published again)", reserved.Messages, reserved.Distinct, reserved.Duplicates)
	// Each order is applied once by B and booked once by the ledger, so
	// every other delivery is a duplicate: a copy a relay published again,
	// or a message Kafka delivered again because its offset was not
	// committed (B #1's kill, a hand-over between members).
	d.say("  duplicates dropped     %7d  by B's watermarks: %d copies relay A published again + %d redelivered by Kafka (offsets B #1 had not committed when it was killed)",
		b.Duplicates, created.Duplicates, int64(b.Duplicates)-created.Duplicates)
	d.say("                         %7d  by the ledger's inbox rows: %d copies relay B published again + %d redelivered by Kafka",
		l.Duplicates, reserved.Duplicates, int64(l.Duplicates)-reserved.Duplicates)
	d.say("  dedup paths            B %d outcomes by watermark (%d rows, one per partition), %d by inbox row; ledger %d by inbox row, %d by watermark",
		b.WatermarkProcessed+b.WatermarkDuplicates, ledger.ReserveWatermarks, b.Processed+b.Duplicates-b.WatermarkProcessed-b.WatermarkDuplicates,
		l.Processed+l.Duplicates-l.WatermarkProcessed-l.WatermarkDuplicates, l.WatermarkProcessed+l.WatermarkDuplicates)
	d.say("  reserved by B          %7d  (%d lost, %d twice)", ledger.Reserved, ledger.ReserveLost, ledger.ReserveTwice)
	d.say("  booked by the ledger   %7d  (%d lost, %d twice)", ledger.Booked, ledger.BookLost, ledger.BookTwice)
	// From what was applied and what was dropped, not from the processed
	// outcomes logged: a member killed with SIGKILL may have committed an
	// effect whose outcome it never logged.
	d.say("  without dedup          B would have reserved %d times for %d orders (%d too many) and the ledger booked %d times (%d too many, before counting the StockReserved that B's extra reservations would have published)",
		ledger.Reserved+int64(b.Duplicates), chainOrders, b.Duplicates, ledger.Booked+int64(l.Duplicates), l.Duplicates)
	d.say("  out of order per key   %7d  (sequence numbers checked by B and by the ledger; %d first copies out of order on the topics)",
		ledger.Reordered, created.Reordered+reserved.Reordered)
	d.say("  time                   %7.1fs", time.Since(start).Seconds())
	problems = append(problems, ledger.Problems()...)
	problems = append(problems, created.Problems("OrderCreated")...)
	problems = append(problems, reserved.Problems("StockReserved")...)
	if len(problems) > 0 {
		d.say("  chain verification     FAILED: %s", strings.Join(problems, "; "))
		return false, nil
	}
	d.say("  chain verification     OK: each of %d orders reserved exactly once; each StockReserved published at least once and booked exactly once; no reordering within a key, no gap in A's streams", chainOrders)
	return true, nil
}

// stopChain asks the chain's processes to stop (SIGTERM) and waits, killing
// those that do not within 30 s.
func stopChain(procs []*chainProc) {
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}
