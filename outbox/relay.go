package outbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/hooklist"
	"github.com/inboxgo/inbox/internal/kafkaerr"
	"github.com/inboxgo/inbox/storage"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/backoff"
)

// Defaults for RelayConfig.
const (
	defaultLease           = 30 * time.Second
	defaultMaxMessages     = 500
	defaultPollInterval    = time.Second
	defaultMinPollInterval = 5 * time.Millisecond
)

// RelayConfig tunes a Relay. The zero value is usable.
type RelayConfig struct {
	// ID names the relay in the leases it holds. Give a relay process the
	// same id across restarts (its host name, a pod name) and it resumes its
	// shards at once; a relay with a new id waits for the old leases to
	// expire. Two relays running at the same time must have different ids.
	// Default: host name, process id and a random suffix.
	ID string
	// Lease is how long a relay holds the shards it claims without claiming
	// again; a relay that dies is replaced after it. Default 30s.
	// A cycle's publish must end within 90% of it after the claim (a relay
	// paused past that publishes nothing of the cycle; see the package doc,
	// "Several relays"): give it more than the longest publish, broker
	// retries included.
	Lease time.Duration
	// MaxShards bounds the shards one relay leases at a time, so that
	// several relays share the work; 0 for no limit.
	MaxShards int
	// MaxMessages bounds one cycle. Default 500, and never more than the
	// Publisher's Limits.
	MaxMessages int
	// PollInterval is the safety poll: the longest pause between two
	// cycles, so the longest a message waits when no wake-up reaches the
	// relay (see "Wake-ups" in the package doc). Default 1s.
	PollInterval time.Duration
	// MinPollInterval is the pause of a relay that polls (one that does
	// not listen for the database's notifications) after a cycle that
	// found less than a full batch but something, or after a wake-up; each
	// cycle that finds nothing doubles it, up to PollInterval. Default
	// 5ms, and never more than PollInterval. However soon a wake-up comes,
	// a cycle starts no sooner than 5ms (or MinPollInterval, if shorter)
	// after the start of one that published, so that a stream of commits
	// is taken several at a time.
	MinPollInterval time.Duration
	// NoWakeups turns the wake-ups off: the relay neither listens for the
	// database's notifications nor takes the signal of this process's
	// enqueues, and polls every MinPollInterval to PollInterval only.
	NoWakeups bool
	// Hooks receive a hooks.RelayCycle event after every cycle that did
	// something or failed (hooks.EventHook); they stack, each called in
	// order, and must be fast.
	Hooks []hooks.Hook
}

// RelayCounters are a relay's totals since it was made.
type RelayCounters struct {
	Cycles, Published, PublishFailures, LeasesLost uint64
}

// Relay publishes stored messages to Kafka, at least once and in order per
// topic and key. Several relays (in one process or many) share the work
// through leases on shards. Each cycle claims the oldest unpublished rows of
// the shards it leases, publishes them (with the sequence headers, see the
// package doc), and after the broker acknowledged marks them published; a
// crash in between publishes them again, with the same headers.
type Relay struct {
	o   *Outbox
	pub Publisher
	pin PinningPublisher // pub, if the outbox is aligned
	// wit and marks check an aligned outbox's numbers against its
	// partitions while it stamps sequence headers; wits is what the relay
	// knows of each shard's partition (only its Run's goroutine uses it).
	wit   Witness
	marks storage.MarkReader
	wits  map[int32]*shardWitness
	// streaming is set when the last cycle claimed rows: the next one then
	// reads an aligned topic's partition count while it claims.
	streaming bool
	cfg       RelayConfig
	maxBytes  int
	log       *slog.Logger
	hooks     *hooklist.List

	cycles, published, failures, leasesLost atomic.Uint64
	listening                               atomic.Bool
}

// NewRelay returns a relay of o's messages through pub.
func (o *Outbox) NewRelay(pub Publisher, cfg RelayConfig) (*Relay, error) {
	if pub == nil {
		return nil, fmt.Errorf("%w: relay needs a publisher", inbox.ErrInvalidConfig)
	}
	if cfg.Lease < 0 || cfg.MaxShards < 0 || cfg.MaxMessages < 0 || cfg.PollInterval < 0 || cfg.MinPollInterval < 0 {
		return nil, fmt.Errorf("%w: negative value in the relay configuration", inbox.ErrInvalidConfig)
	}
	if cfg.Lease != 0 && cfg.Lease < 10*time.Millisecond {
		return nil, fmt.Errorf("%w: relay lease %v is shorter than 10ms", inbox.ErrInvalidConfig, cfg.Lease)
	}
	cfg.Lease = cmp.Or(cfg.Lease, defaultLease)
	cfg.MaxMessages = cmp.Or(cfg.MaxMessages, defaultMaxMessages)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, defaultPollInterval)
	cfg.MinPollInterval = min(cmp.Or(cfg.MinPollInterval, defaultMinPollInterval), cfg.PollInterval)
	maxBytes := maxMessageBytes
	if l, ok := pub.(Limited); ok {
		m, b := l.Limits()
		if m < 1 || b < maxMessageBytes {
			return nil, fmt.Errorf("%w: the publisher takes %d messages, %d bytes at a time; a relay needs at least 1 message of %d bytes",
				inbox.ErrInvalidConfig, m, b, maxMessageBytes)
		}
		cfg.MaxMessages, maxBytes = min(cfg.MaxMessages, m), b
	}
	if cfg.ID == "" {
		cfg.ID = defaultRelayID()
	}
	if len(cfg.ID) > 128 {
		return nil, fmt.Errorf("%w: relay id longer than 128 bytes", inbox.ErrInvalidConfig)
	}
	hl, err := hooklist.New("outbox.RelayConfig.Hooks", cfg.Hooks)
	if err != nil {
		return nil, err
	}
	r := &Relay{o: o, pub: pub, cfg: cfg, maxBytes: maxBytes, log: o.log.With("relay", cfg.ID), hooks: hl}
	if o.shards > 0 {
		pin, ok := pub.(PinningPublisher)
		if !ok {
			return nil, fmt.Errorf("%w: the relay of an outbox aligned to %q needs a publisher that pins partitions (outbox.PinningPublisher, as KafkaPublisher), got %T",
				inbox.ErrInvalidConfig, o.cfg.AlignedTopic, pub)
		}
		if kp, ok := pub.(*KafkaPublisher); ok {
			if err := kp.canPin(); err != nil {
				return nil, err
			}
		}
		r.pin = pin
		if o.seq != nil {
			wit, ok := pub.(Witness)
			if !ok {
				return nil, fmt.Errorf("%w: the relay of an outbox aligned to %q stamps sequence headers and needs a publisher that reads its partitions back (outbox.Witness, as KafkaPublisher), got %T; without one, set Config.NoSequenceHeaders",
					inbox.ErrInvalidConfig, o.cfg.AlignedTopic, pub)
			}
			marks, ok := o.store.(storage.MarkReader)
			if !ok {
				return nil, fmt.Errorf("%w: the relay of an outbox aligned to %q stamps sequence headers and needs a store that reads marks (storage.MarkReader), got %T; without one, set Config.NoSequenceHeaders",
					inbox.ErrInvalidConfig, o.cfg.AlignedTopic, o.store)
			}
			r.wit, r.marks, r.wits = wit, marks, map[int32]*shardWitness{}
		}
	}
	return r, nil
}

func defaultRelayID() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// Counters returns the relay's totals so far.
func (r *Relay) Counters() RelayCounters {
	return RelayCounters{Cycles: r.cycles.Load(), Published: r.published.Load(), PublishFailures: r.failures.Load(), LeasesLost: r.leasesLost.Load()}
}

// Run relays until ctx ends, then releases its leases and returns ctx's
// error. It returns at once a *PartitionCountError when the aligned
// outbox's topic has another partition count than its shards when it
// starts. Failures after that are logged and retried with backoff; they
// never stop it.
// What can keep it retrying forever: the database or the broker being down
// (logged at Warn), and a stored message the broker refuses for good (too
// large for the topic's max.message.bytes, a topic it does not accept,
// authorization; logged at Error every cycle): the relay never drops a
// message, so its shard waits until an operator fixes the topic or the row,
// while the other shards go on.
func (r *Relay) Run(ctx context.Context) error {
	defer r.release()
	// A topic whose partitions are not the aligned outbox's shards at the
	// start is a setup mistake: said at once, with both counts. A count
	// that changes later is waited out below.
	if err := r.checkPartitions(ctx); errors.Is(err, ErrPartitionCount) {
		return err
	}
	notified, local := make(chan struct{}, 1), make(chan struct{}, 1)
	if !r.cfg.NoWakeups {
		r.o.wakers.add(local)
		defer r.o.wakers.remove(local)
		if n, ok := r.o.store.(storage.Notifier); ok {
			lctx, stop := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				r.listen(lctx, n, notified, r.listening.Store)
			}()
			defer func() { stop(); <-done }()
		}
	}
	failures := 0
	// idle counts the cycles that found nothing since the last that found
	// something or followed a wake-up: the polls back off with it.
	idle := 0
	for {
		cycleStart := time.Now()
		n, err := r.PublishOnce(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := time.Duration(0)
		switch {
		case errors.Is(err, ErrPartitionCount):
			// Publishing anyway would put keys where Kafka's partitioner
			// does not and mix streams: the whole outbox waits.
			failures++
			wait = backoff.Wait(r.o.cfg.MinBackoff, r.o.cfg.MaxBackoff, failures)
			r.log.Error("the aligned topic's partition count differs from the outbox's shards; nothing is published until they agree",
				"error", err, "retry_in", wait)
			if err := backoff.Sleep(ctx, wait); err != nil {
				return err
			}
			continue
		case errors.Is(err, ErrShardStuck) && !errors.Is(err, errPublish):
			// The other shards go on at full speed; the stuck one is
			// reported on every cycle until the row is repaired.
			failures = 0
			r.log.Error("relay cannot publish a stored message; its shard waits (keys of other shards go on)", "error", err)
			if n < r.cfg.MaxMessages {
				wait = r.pollAfter(n, &idle)
			}
		case err != nil:
			failures++
			wait = backoff.Wait(r.o.cfg.MinBackoff, r.o.cfg.MaxBackoff, failures)
			if permanent, _, cause := kafkaerr.Classify(err); permanent {
				// Nothing is dropped: the message's shard waits for it (the
				// keys after it must not overtake it), retried until the
				// message or the topic is fixed; other shards go on.
				r.log.Error("the broker refuses a stored message for good; its shard waits until the message or the topic is fixed",
					"error", err, "cause", cause, "retry_in", wait)
			} else {
				r.log.Warn("relay cycle failed; trying again", append([]any{"error", err, "in", wait}, r.o.missingTable(err)...)...)
			}
			// A failing database or broker is not hurried by wake-ups.
			if err := backoff.Sleep(ctx, wait); err != nil {
				return err
			}
			continue
		case n < r.cfg.MaxMessages:
			failures = 0
			wait = r.pollAfter(n, &idle)
		default:
			failures = 0
			idle = 0
		}
		if wait > 0 {
			woken, err := pause(ctx, wait, notified, local, r.listening.Load)
			if err != nil {
				return err
			}
			if woken {
				idle = 0
				if n > 0 {
					// Under a steady stream of commits every one wakes
					// the relay: cycles that start at least this far
					// apart take several commits each, rather than
					// claiming (on SQLite: taking the write lock) once
					// per commit. Counted from the start of the cycle
					// that published, so a cycle that took longer than
					// that is followed at once: a gap after it would
					// only add to every message's wait.
					gap := min(r.cfg.MinPollInterval, defaultMinPollInterval)
					if err := backoff.Sleep(ctx, gap-time.Since(cycleStart)); err != nil {
						return err
					}
				}
			}
		}
	}
}

// missingTable returns, when err is one the store reports as a missing
// table (storage.MissingTableReporter: never migrated, or dropped while the
// relay runs), log attributes naming the outbox's table and the call that
// makes its tables; nil for any other err. The relay still retries: the
// table may come back.
func (o *Outbox) missingTable(err error) []any {
	mt, ok := o.store.(storage.MissingTableReporter)
	if !ok || !mt.IsMissingTable(err) {
		return nil
	}
	name := fmt.Sprintf("the tables of %T", o.store)
	if n, ok := o.store.(interface{ Table() string }); ok {
		name = n.Table()
		if s, ok := o.store.(interface{ Schema() string }); ok && s.Schema() != "" {
			name = s.Schema() + "." + name
		}
		name += " (or another table of the outbox's)"
	}
	return []any{"missing_table", name,
		"fix", "run Outbox.Migrate (or inboxctl outbox migrate): the table does not exist (dropped?); retrying until it does"}
}

// pollAfter returns the pause after a cycle that found n messages, less
// than a full batch, and counts it in idle: MinPollInterval, doubled for
// each cycle in a row that found nothing, up to the safety poll. A wake-up
// ends the pause sooner. A relay that listens polls the same way: the
// database's notification is sent only by a transaction that finds its
// shard published through (the relay may be idle), not by those that
// commit while the relay works through a backlog.
func (r *Relay) pollAfter(n int, idle *int) time.Duration {
	if n > 0 {
		*idle = 0
	} else {
		*idle++
	}
	d := r.cfg.MinPollInterval
	for i := 1; i < *idle && d < r.cfg.PollInterval; i++ {
		d *= 2
	}
	return min(d, r.cfg.PollInterval)
}

func (r *Relay) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.o.store.Release(ctx, r.o.db.WithContext(ctx), r.cfg.ID); err != nil {
		r.log.Warn("relay could not release its leases; other relays take its shards when they expire", "error", err, "lease", r.cfg.Lease)
	}
}

// Drain runs cycles until one finds nothing to publish, and returns how
// many messages it marked published: for a shutdown that leaves nothing
// behind, and for tests. It stops at the first cycle that fails, with its
// error; unlike Run, it neither retries nor pauses.
func (r *Relay) Drain(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := r.PublishOnce(ctx)
		total += n
		if err != nil || n == 0 {
			return total, err
		}
	}
}

// PublishOnce runs one cycle: claim, publish, mark published. It returns
// how many messages it marked published. A failed publish marks, in each
// shard, the messages before the first that failed.
func (r *Relay) PublishOnce(ctx context.Context) (int, error) {
	start := time.Now()
	ev := hooks.Event{Kind: hooks.RelayCycle, Offset: -1}
	defer func() {
		r.cycles.Add(1)
		if ev.Relay.Claimed > 0 || ev.Err != nil {
			ev.Duration = time.Since(start)
			r.hooks.Emit(ev)
		}
	}()
	n, err := r.cycle(ctx, &ev.Relay)
	ev.Relay.Published, ev.Err = n, err
	return n, err
}

func (r *Relay) cycle(ctx context.Context, ev *hooks.RelayCycleReport) (int, error) {
	var rows []storage.OutboxRow
	claimedAt := time.Now()
	req := storage.ClaimRequest{Relay: r.cfg.ID, Lease: r.cfg.Lease, MaxShards: r.cfg.MaxShards, MaxRows: r.cfg.MaxMessages}
	// A store that reads the source and epoch with the claim (no earlier
	// than the claim began, which is all the rule below needs) spares the
	// cycle a round trip.
	var source *claimedSource
	sc, _ := r.o.store.(storage.SourceClaimer)
	// The partition count must be read before the publish, not after the
	// claim: under a stream of commits the broker's answer is awaited
	// during the claim, not after it, where it would add to every
	// message's wait. A relay that found nothing last time asks only
	// once it has rows, so an idle relay sends the broker nothing.
	checkPartitions := func() error { return r.checkPartitions(ctx) }
	asked := r.pin != nil && r.streaming
	if asked {
		checkPartitions = r.askPartitions(ctx)
	}
	err := r.o.retry(ctx, "claim", func() error {
		var err error
		if r.o.seq != nil && sc != nil {
			source = &claimedSource{}
			rows, source.id, source.epoch, err = sc.ClaimSource(ctx, r.o.db.WithContext(ctx), req)
			return err
		}
		rows, err = r.o.store.Claim(ctx, r.o.db.WithContext(ctx), req)
		return err
	})
	r.streaming = err == nil && len(rows) > 0
	if !r.streaming {
		if asked {
			_ = checkPartitions() // nothing is published: only the ask's end is awaited
		}
		if err != nil {
			return 0, fmt.Errorf("outbox: relay claim: %w", err)
		}
		return 0, nil
	}
	ev.Claimed = len(rows)
	if err := checkPartitions(); err != nil {
		return 0, err
	}
	// The source and epoch are read after the claim, on every cycle that
	// publishes: a bump of the epoch applies to every row published by a
	// cycle that starts after it, first copies and copies alike.
	stamp, err := r.sequenceStamp(ctx, source)
	if err != nil {
		return 0, err
	}
	var wit *witnessed
	if r.wit != nil && stamp != nil {
		if wit, err = r.witness(ctx, rows, stamp); err != nil {
			return 0, err
		}
	}
	msgs := make([]kafka.Message, 0, len(rows))
	sent := make([]storage.OutboxRow, 0, len(rows))
	msgOf := make([]int, 0, len(rows)) // sent[i]'s index in msgs; -1: already in its partition
	var stamped []*sequenceStamp       // sent[i]'s stamp, when the partitions were checked
	var epochs []int64                 // and the epoch it went out under
	perShard := map[int32]int{}
	bytes := 0
	var bad error
	blocked := map[int32]bool{}
	for i, row := range rows {
		if blocked[row.Shard] {
			continue
		}
		if wit != nil && wit.skip[i] {
			sent = append(sent, row)
			msgOf = append(msgOf, -1)
			stamped = append(stamped, nil)
			epochs = append(epochs, r.wits[row.Shard].events[row.EventID].epoch)
			continue
		}
		hs, err := decodeHeaders(row.Headers)
		if err == nil && r.pin != nil {
			err = r.misaligned(row)
		}
		if err != nil {
			// Publishing what follows in this shard would overtake it:
			// the shard stops here, loudly, until someone repairs the row.
			blocked[row.Shard] = true
			bad = errors.Join(bad, fmt.Errorf("%w: shard %d at seq %d (event %q): %w", ErrShardStuck, row.Shard, row.Seq, row.EventID, err))
			continue
		}
		switch {
		case wit != nil:
			hs = wit.stamps[i].apply(hs, true, row.Shard, row.Seq)
		case stamp != nil:
			hs = stamp.apply(hs, row.Key != nil || r.pin != nil, row.Shard, row.Seq)
		}
		// Offset -1: a PinningPublisher that learns where the broker put
		// the message sets it (see verify).
		m := kafka.Message{Topic: row.Topic, Key: row.Key, Value: row.Value, Headers: hs, Offset: -1}
		size := messageBytes(m.Key, m.Value, m.Headers)
		if len(msgs) > 0 && bytes+size > r.maxBytes {
			break // what is left is a suffix of every shard's run
		}
		bytes += size
		msgOf = append(msgOf, len(msgs))
		if wit != nil {
			stamped = append(stamped, wit.stamps[i])
			epochs = append(epochs, wit.stamps[i].epochN)
		}
		msgs = append(msgs, m)
		sent = append(sent, row)
		perShard[row.Shard]++
	}
	if len(sent) == 0 {
		return 0, bad
	}
	rows = sent
	var pubErr error
	var placed *placement
	if len(msgs) > 0 {
		// Publishing after the lease expired would only duplicate what the
		// next relay publishes, but it is wasted work: stop in time.
		pubCtx, cancel := context.WithDeadline(ctx, claimedAt.Add(r.cfg.Lease*9/10))
		if r.pin != nil {
			// A shard is a partition: misaligned checked each row's shard.
			parts := make([]int, 0, len(msgs))
			for i, row := range rows {
				if msgOf[i] >= 0 {
					parts = append(parts, int(row.Shard))
				}
			}
			pubErr = r.pin.PublishPinned(pubCtx, msgs, parts, r.o.shards)
			if wit != nil {
				placed = placementOf(msgs, parts)
			}
		} else {
			pubErr = r.pub.Publish(pubCtx, msgs)
		}
		cancel()
	}
	rowErr := perRow(pubErr, msgOf, len(msgs))
	if wit != nil && len(msgs) > 0 {
		// Marked only once the partitions show that each message is the
		// first of its number; after a failed publish nothing is marked:
		// the next check finds what did land and does not send it again.
		rowErr = pubErr
		if pubErr == nil {
			lost, err := r.verify(ctx, wit, rows, msgOf, stamped, perShard, placed)
			switch {
			case err != nil:
				r.witnessPublished(wit, nil, true)
				return 0, err
			case len(lost) > 0:
				each := make(kafka.WriteErrors, len(rows))
				for i := range lost {
					each[i] = errLostRace
				}
				rowErr = each
			}
		}
	}
	marks := marksOf(rows, rowErr)
	if pubErr != nil {
		r.failures.Add(1)
	}
	var ackErr error
	if len(marks) > 0 {
		if wit != nil {
			r.markOffsets(wit, marks, rows, epochs)
		}
		ackErr = r.o.retry(ctx, "ack", func() error { return r.o.store.Ack(ctx, r.o.db.WithContext(ctx), r.cfg.ID, marks) })
	}
	if wit != nil {
		r.witnessPublished(wit, marks, pubErr != nil || ackErr != nil || rowErr != nil)
	}
	if len(marks) > 0 {
		if errors.Is(ackErr, storage.ErrLeaseLost) {
			ev.LeaseLost = true
			r.leasesLost.Add(1)
			r.log.Warn("an acknowledgement was refused: another relay took over shards this relay had published, or the database went back under it (the row at the mark is another event); what is not marked is checked and published again", "error", ackErr)
			ackErr = nil
		}
		if ackErr != nil {
			return 0, fmt.Errorf("outbox: relay mark published (the messages were sent and will be sent again): %w", ackErr)
		}
	}
	acked := 0
	for _, row := range rows {
		for _, m := range marks {
			if m.Shard == row.Shard && row.Seq <= m.Seq {
				acked++
				break
			}
		}
	}
	r.published.Add(uint64(acked))
	if pubErr != nil {
		return acked, fmt.Errorf("%w: %w", errPublish, pubErr)
	}
	return acked, bad
}

// claimedSource is the source id and epoch a storage.SourceClaimer read
// with the cycle's claim.
type claimedSource struct {
	id    string
	epoch int64
}

// sequenceStamp returns the stamp of a cycle's sequence headers, with the
// source id and epoch read with the claim (claimed, if not nil) or else
// read from the store now; nil when the Outbox stamps none.
func (r *Relay) sequenceStamp(ctx context.Context, claimed *claimedSource) (*sequenceStamp, error) {
	if r.o.seq == nil {
		return nil, nil
	}
	if claimed != nil {
		return newSequenceStamp(r.o.cfg.Headers, claimed.id, claimed.epoch, r.o.shards)
	}
	var source string
	var epoch int64
	err := r.o.retry(ctx, "source", func() error {
		var err error
		source, epoch, err = r.o.seq.Source(ctx, r.o.db.WithContext(ctx))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: relay read the outbox's source and epoch: %w", err)
	}
	return newSequenceStamp(r.o.cfg.Headers, source, epoch, r.o.shards)
}

// checkPartitions fails with a *PartitionCountError if the outbox is
// aligned and its topic has another partition count than its shards.
func (r *Relay) checkPartitions(ctx context.Context) error {
	if r.pin == nil {
		return nil
	}
	topic := r.o.cfg.AlignedTopic
	n, err := r.pin.Partitions(ctx, topic)
	if err != nil {
		return fmt.Errorf("outbox: relay read the partition count of the aligned topic: %w", err)
	}
	if n != r.o.shards {
		return &PartitionCountError{Topic: topic, Partitions: n, Shards: r.o.shards}
	}
	return nil
}

// askPartitions starts checkPartitions at once and returns a function that
// waits for its answer.
func (r *Relay) askPartitions(ctx context.Context) func() error {
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		err = r.checkPartitions(ctx)
	}()
	return func() error {
		<-done
		return err
	}
}

// misaligned returns why an aligned outbox's relay must not publish row
// to partition row.Shard: a row of another topic, or one whose shard is
// not the partition Kafka's default partitioner gives its key, was stored
// by an outbox that was not aligned to this topic.
func (r *Relay) misaligned(row storage.OutboxRow) error {
	topic := r.o.cfg.AlignedTopic
	if row.Topic != topic {
		return fmt.Errorf("stored for topic %q, and the outbox is aligned to %q", row.Topic, topic)
	}
	if want := int32(partitionHash(row.Key, row.EventID) % uint32(r.o.shards)); row.Shard != want {
		return fmt.Errorf("its key belongs to partition %d of %q, not %d: it was stored by an outbox that was not aligned", want, topic, row.Shard)
	}
	return nil
}

// ErrShardStuck is wrapped by a relay cycle's error when a stored message
// cannot be published (its stored headers are unreadable): its shard stops
// there, since publishing what follows would overtake it, and the error is
// logged on every cycle until the row is repaired. Other shards go on.
var ErrShardStuck = errors.New("outbox: a stored message cannot be published; its shard waits")

var errPublish = errors.New("outbox: relay publish")

// errLostRace marks a published message whose number another writer's
// message took first in the partition.
var errLostRace = errors.New("outbox: another writer published the same number first")

// perRow maps a publish error of msgs to the cycle's rows: a
// kafka.WriteErrors gets one entry per row (nil for a row that was not
// sent, msgOf[i] < 0); any other error is returned as it is.
func perRow(err error, msgOf []int, sent int) error {
	var perMessage kafka.WriteErrors
	if err == nil || !errors.As(err, &perMessage) || len(perMessage) != sent {
		return err
	}
	out := make(kafka.WriteErrors, len(msgOf))
	for i, j := range msgOf {
		if j >= 0 {
			out[i] = perMessage[j]
		}
	}
	return out
}

// marksOf returns, for each shard of rows, the last Seq before the first
// message that failed (all of them when err is nil). rows are in (shard,
// seq) order. An error that is not per message fails every message.
func marksOf(rows []storage.OutboxRow, err error) []storage.Mark {
	var perMessage kafka.WriteErrors
	if err != nil && (!errors.As(err, &perMessage) || len(perMessage) != len(rows)) {
		return nil
	}
	var marks []storage.Mark
	stopped := map[int32]bool{}
	for i, row := range rows {
		switch {
		case stopped[row.Shard]:
		case perMessage != nil && perMessage[i] != nil:
			stopped[row.Shard] = true
		case len(marks) > 0 && marks[len(marks)-1].Shard == row.Shard:
			marks[len(marks)-1].Seq, marks[len(marks)-1].EventID = row.Seq, row.EventID
		default:
			marks = append(marks, storage.Mark{Shard: row.Shard, Seq: row.Seq, EventID: row.EventID})
		}
	}
	return marks
}
