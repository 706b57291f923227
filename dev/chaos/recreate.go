package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/internal/backoff"
)

// recreate is the configuration-fault round: a consumer with StoreOffsets
// consumes a topic, stops; the topic is deleted and recreated and fewer
// messages than before are written to each partition, so every stored
// offset lies beyond the new log's end. Started again, the consumer must not
// wait silently for offsets that will not come for a long time (kafka-go's
// reader retries an offset past the end without a word): it must stop the
// partitions loudly. Then the operator deletes the stored offsets, and the
// new messages must be applied exactly once.
func (rr *faultRound) recreate(ctx context.Context) error {
	rr.parts = rr.fc.Partitions
	cleanup, err := rr.setup(ctx, true)
	if err != nil {
		return err
	}
	defer cleanup()
	row := &FaultRow{Dialect: rr.cfg.Dialect, Batch: rr.batch, Class: TopicRecreated}
	defer func() { rr.rep.Rows = append(rr.rep.Rows, row) }()
	parts := rr.parts
	before := rr.orders("before", rr.fc.Before*parts)
	after := rr.orders("after", rr.fc.After*parts)
	row.Messages, row.Sent = len(before)+len(after), len(before)+len(after)

	cfg := rr.consumerConfig(rr.onEvent)
	cfg.Offsets.Store, cfg.Offsets.Table = true, rr.backend.OffsetsTable()
	rr.say("topic %s: %d messages per partition, then recreated with %d per partition", rr.topic, rr.fc.Before, rr.fc.After)

	if err := rr.writeEven(ctx, before); err != nil {
		return err
	}
	ok, err := rr.consumeUntilApplied(ctx, cfg, before)
	if err != nil {
		return err
	}
	if !ok {
		row.Problems = append(row.Problems, fmt.Sprintf("the first %d messages were not consumed within %v", len(before), rr.fc.Budget))
		return nil
	}

	// The configuration fault: the topic is recreated while the consumer is
	// stopped; its stored offsets stay.
	deleteTopic(rr.cfg.Brokers, rr.topic)
	if err := rr.recreateTopic(ctx); err != nil {
		return err
	}
	if err := rr.writeEven(ctx, after); err != nil {
		return err
	}
	c, stop, err := rr.startConsumer(ctx, cfg)
	if err != nil {
		return err
	}
	t0 := time.Now()
	var stopped []*consumer.PartitionStoppedError
	for time.Since(t0) < rr.fc.StopBudget {
		stopped = stopped[:0]
		for _, s := range c.Stopped() {
			if s.Topic == rr.topic {
				stopped = append(stopped, s)
			}
		}
		if len(stopped) == parts {
			break
		}
		if backoff.Sleep(ctx, 250*time.Millisecond) != nil {
			break
		}
	}
	apps, _ := rr.backend.Applications(ctx, rr.db)
	silentApplied := count(apps, after)
	if serr := stop(); serr != nil {
		rr.say("stopping the consumer: %v", serr)
	}
	switch {
	case len(stopped) == 0:
		row.Problems = append(row.Problems, fmt.Sprintf("the consumer waited silently: no partition stopped within %v although every stored offset is beyond the recreated log's end (%d of %d new messages applied meanwhile)",
			rr.fc.StopBudget, silentApplied, len(after)))
	default:
		rr.say("%d of %d partitions stopped after %.1fs: %v", len(stopped), parts, time.Since(t0).Seconds(), stopped[0])
		if len(stopped) < parts {
			row.Problems = append(row.Problems, fmt.Sprintf("%d of %d partitions stopped within %v", len(stopped), parts, rr.fc.StopBudget))
		}
		for _, s := range stopped {
			if s.Reason != consumer.ReasonOffsetBeyondLogEnd {
				row.Problems = append(row.Problems, fmt.Sprintf("partition %d stopped with reason %q, want %q (%v)", s.Partition, s.Reason, consumer.ReasonOffsetBeyondLogEnd, s))
				break
			}
		}
	}

	// The operator's remedy: delete the group's stored offsets. The group's
	// own were deleted with the topic; a consumer that committed the stale
	// stored offsets to Kafka meanwhile made them wrong again, and then the
	// operator has to delete those too.
	res := rr.db.WithContext(ctx).Exec("DELETE FROM "+rr.backend.OffsetsTable()+" WHERE group_id = ? AND topic = ?", rr.group, rr.topic)
	if res.Error != nil {
		return fmt.Errorf("delete the stored offsets: %w", res.Error)
	}
	rr.say("operator deleted %d stored offsets", res.RowsAffected)
	if beyond, err := rr.committedBeyondEnd(ctx); err != nil {
		rr.say("reading the group's committed offsets: %v", err)
	} else if beyond != "" {
		row.Problems = append(row.Problems, fmt.Sprintf("the consumer committed the stale stored offsets to the group (%s): deleting the stored offsets is not enough, the group's offsets must be deleted as well", beyond))
		client := &kafka.Client{Addr: kafka.TCP(rr.cfg.Brokers...), Timeout: 10 * time.Second}
		parts := make([]int, rr.parts)
		for i := range parts {
			parts[i] = i
		}
		if _, err := client.OffsetDelete(ctx, &kafka.OffsetDeleteRequest{GroupID: rr.group, Topics: map[string][]int{rr.topic: parts}}); err != nil {
			return fmt.Errorf("delete the group's offsets: %w", err)
		}
		rr.say("operator deleted the group's committed offsets too (%s)", beyond)
	}
	rr.say("starting the consumer again")
	done, err := rr.consumeUntilApplied(ctx, cfg, after)
	if err != nil {
		return err
	}
	if apps, err = rr.backend.Applications(ctx, rr.db); err != nil {
		return err
	}
	for _, o := range append(before, after...) {
		switch n := apps[o.OrderID]; {
		case n == 0:
			row.Unresolved++
			if done {
				row.Lost++
			}
			row.Problems = append(row.Problems, fmt.Sprintf("%s never applied", o.OrderID))
		case n > 1:
			row.Applied++
			row.Doubled++
			row.Problems = append(row.Problems, fmt.Sprintf("%s applied %d times", o.OrderID, n))
		default:
			row.Applied++
		}
	}
	if len(row.Problems) > 6 {
		row.Problems = append(row.Problems[:6], fmt.Sprintf("... and %d more", len(row.Problems)-6))
	}
	return nil
}

// orders makes n new orders of the round.
func (rr *faultRound) orders(tag string, n int) []inventory.Order {
	out := make([]inventory.Order, n)
	for i := range out {
		out[i] = inventory.Order{OrderID: fmt.Sprintf("order-%s-%s-%04d", rr.backend.RunID, tag, i),
			SKU: inventory.SKUs[rr.rng.IntN(len(inventory.SKUs))], Qty: 1 + rr.rng.Int64N(5)}
		rr.classOf[out[i].OrderID] = TopicRecreated
	}
	return out
}

// writeEven writes the orders round-robin, the same number to each
// partition.
func (rr *faultRound) writeEven(ctx context.Context, orders []inventory.Order) error {
	w := inventory.Writer(rr.cfg.Brokers, rr.topic)
	w.Balancer = &kafka.RoundRobin{}
	defer w.Close()
	base := time.Now().UTC().Add(-time.Hour)
	msgs := make([]kafka.Message, len(orders))
	for i, o := range orders {
		msgs[i] = inventory.Message(o, base.Add(time.Duration(i)*time.Millisecond))
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return inventory.Write(wctx, w, msgs)
}

// recreateTopic creates the round's topic again once the broker finished
// deleting it.
func (rr *faultRound) recreateTopic(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		err := inventory.CreateTopic(ctx, rr.cfg.Brokers[0], rr.topic, rr.parts)
		if err == nil {
			return nil
		}
		if backoff.Sleep(ctx, 500*time.Millisecond) != nil {
			return fmt.Errorf("recreate topic %s: %w", rr.topic, err)
		}
	}
}

// consumeUntilApplied runs a consumer with cfg until every order is applied
// and committed, within the round's budget, and stops it.
func (rr *faultRound) consumeUntilApplied(ctx context.Context, cfg consumer.Config, orders []inventory.Order) (bool, error) {
	_, stop, err := rr.startConsumer(ctx, cfg)
	if err != nil {
		return false, err
	}
	ok, err := rr.waitApplied(ctx, orders, rr.fc.Budget)
	if serr := stop(); serr != nil {
		rr.say("stopping the consumer: %v", serr)
	}
	return ok, err
}

// waitApplied waits, within budget, until every order is in the ledger and
// the group committed to the end of the topic.
func (rr *faultRound) waitApplied(ctx context.Context, orders []inventory.Order, budget time.Duration) (bool, error) {
	deadline := time.Now().Add(budget)
	for time.Now().Before(deadline) {
		apps, err := rr.backend.Applications(ctx, rr.db)
		if err == nil && count(apps, orders) == len(orders) {
			p, err := inventory.GroupProgress(ctx, rr.cfg.Brokers, rr.group, rr.topic, rr.parts)
			if err == nil && p.Done {
				return true, nil
			}
		}
		if err := backoff.Sleep(ctx, 300*time.Millisecond); err != nil {
			return false, err
		}
	}
	return false, nil
}

// count returns how many of orders were applied at least once.
func count(apps map[string]int64, orders []inventory.Order) int {
	n := 0
	for _, o := range orders {
		if apps[o.OrderID] > 0 {
			n++
		}
	}
	return n
}

// committedBeyondEnd describes the group's committed offsets that lie
// beyond their partition's end ("" if none).
func (rr *faultRound) committedBeyondEnd(ctx context.Context) (string, error) {
	client := &kafka.Client{Addr: kafka.TCP(rr.cfg.Brokers...), Timeout: 10 * time.Second}
	parts := make([]int, rr.parts)
	req := make([]kafka.OffsetRequest, rr.parts)
	for i := range parts {
		parts[i], req[i] = i, kafka.LastOffsetOf(i)
	}
	offs, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{rr.topic: req}})
	if err != nil {
		return "", err
	}
	ends := map[int]int64{}
	for _, p := range offs.Topics[rr.topic] {
		ends[p.Partition] = p.LastOffset
	}
	res, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: rr.group, Topics: map[string][]int{rr.topic: parts}})
	if err != nil {
		return "", err
	}
	var out []string
	for _, p := range res.Topics[rr.topic] {
		if p.CommittedOffset > ends[p.Partition] {
			out = append(out, fmt.Sprintf("partition %d at %d, log end %d", p.Partition, p.CommittedOffset, ends[p.Partition]))
		}
	}
	return strings.Join(out, "; "), nil
}
