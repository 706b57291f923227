package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/internal/backoff"
)

// KafkaLibraryFree is the end-to-end reference written without this
// library: kafka-go's consumer group, a goroutine per assigned partition
// reading with its own kafka.Reader, batches of up to Options.BatchSize
// messages, each applied with the same set-based UPDATE as the batch-handler
// modes in one transaction, then its offset committed by a goroutine of the
// partition's that commits the latest offset whenever the previous commit
// is done, off the batches' path. No dedup, no hooks, no failure policy:
// what a careful hand-written pipeline costs, against which the library's
// consumer machinery is measured.
const KafkaLibraryFree = "library-free"

// KafkaClassicInbox is the end-to-end reference for a per-message handler,
// written without this library: the classic hand-written inbox a user of a
// general-purpose Kafka framework (Watermill with watermill-kafka, say)
// writes in the handler. kafka-go's consumer group and a goroutine and a
// kafka.Reader per assigned partition as in KafkaLibraryFree, then for each
// message one transaction with the inbox row (INSERT ... ON CONFLICT DO
// NOTHING on the hand-rolled dedup table, INSERT IGNORE on MariaDB) and,
// if the row is new, the effect (the per-message UPDATE of the modes with a
// Handler); the offset committed after it, by the partition's committer
// goroutine off the messages' path (as Sarama's periodic auto-commit of
// marked offsets is). No retries, no failure policy, no hooks.
const KafkaClassicInbox = "classic-inbox"

// libraryFreeFill is how long a batch that has messages waits for more
// before it is applied: under load a partition's next messages are already
// fetched, so this only bounds the wait at the end of the topic.
const libraryFreeFill = 5 * time.Millisecond

// consumeLibraryFree consumes the topic's n events into f's tables as
// consumer group groupID, as KafkaLibraryFree describes, and returns the
// times of the first and the last effect's commit.
//
// With classic, it is KafkaClassicInbox instead: one message per
// transaction, with its inbox row.
func consumeLibraryFree(ctx context.Context, f *Fixture, brokers []string, topic, groupID string, n, batchSize int, classic bool) (first, last time.Time, err error) {
	ctx, cancel := context.WithTimeout(ctx, kafkaTimeout)
	defer cancel()
	g, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID: groupID, Brokers: brokers, Topics: []string{topic}, StartOffset: kafka.FirstOffset,
	})
	if err != nil {
		return first, last, fmt.Errorf("bench: library-free group: %w", err)
	}
	defer g.Close()
	var (
		applied  atomic.Int64
		mu       sync.Mutex
		failure  error
		done     = make(chan struct{})
		doneOnce sync.Once
	)
	fail := func(err error) {
		mu.Lock()
		if failure == nil {
			failure = err
		}
		mu.Unlock()
		cancel()
	}
	committed := func(k int) {
		now := time.Now()
		mu.Lock()
		if first.IsZero() {
			first = now
		}
		last = now
		mu.Unlock()
		if applied.Add(int64(k)) >= int64(n) {
			doneOnce.Do(func() { close(done) })
		}
	}
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	for ctx.Err() == nil {
		gen, err := g.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if err := backoff.Sleep(ctx, 100*time.Millisecond); err != nil {
				break
			}
			continue
		}
		for _, a := range gen.Assignments[topic] {
			gen.Start(func(gctx context.Context) {
				run := libraryFreePartition
				if classic {
					run = classicInboxPartition
				}
				if err := run(gctx, f, brokers, topic, a, gen, batchSize, committed); err != nil && gctx.Err() == nil {
					fail(err)
				}
			})
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if applied.Load() < int64(n) {
		return first, last, fmt.Errorf("bench: library-free consumer applied %d of %d events: %w", applied.Load(), n, errors.Join(failure, ctx.Err()))
	}
	return first, last, nil
}

// libraryFreePartition applies one assigned partition in batches until ctx
// ends, committing each batch's offset after its transaction.
func libraryFreePartition(ctx context.Context, f *Fixture, brokers []string, topic string, a kafka.PartitionAssignment, gen *kafka.Generation, batchSize int, committed func(int)) (err error) {
	r, err := libraryFreeReader(brokers, topic, a)
	if err != nil {
		return err
	}
	defer r.Close()
	commit, wait := libraryFreeCommitter(topic, a, gen)
	defer func() {
		if cerr := wait(); err == nil {
			err = cerr
		}
	}()
	skus := make([]int64, 0, batchSize)
	for ctx.Err() == nil {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return err
		}
		skus = skus[:0]
		var next int64
		fillCtx, stop := context.WithTimeout(ctx, libraryFreeFill)
		for {
			sku, err := strconv.ParseInt(string(m.Key), 10, 64)
			if err != nil {
				stop()
				return fmt.Errorf("bench: offset %d: key %q: %w", m.Offset, m.Key, err)
			}
			skus, next = append(skus, sku), m.Offset+1
			if len(skus) == batchSize {
				break
			}
			if m, err = r.FetchMessage(fillCtx); err != nil {
				break // nothing more fetched in time: apply what there is
			}
		}
		stop()
		if err := f.Backend.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			return f.setEffect(tx, skus)
		}); err != nil {
			return err
		}
		commit(next)
		committed(len(skus))
	}
	return ctx.Err()
}

// libraryFreeReader reads partition a of topic from its assigned offset.
func libraryFreeReader(brokers []string, topic string, a kafka.PartitionAssignment) (*kafka.Reader, error) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: brokers, Topic: topic, Partition: a.ID,
		MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 100 * time.Millisecond,
	})
	if err := r.SetOffset(a.Offset); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// libraryFreeCommitter starts the goroutine that commits partition a's
// latest offset whenever the previous commit is done: commit hands it the
// next offset (replacing one not yet taken), wait ends it and returns the
// first commit error.
func libraryFreeCommitter(topic string, a kafka.PartitionAssignment, gen *kafka.Generation) (commit func(next int64), wait func() error) {
	offsets := make(chan int64, 1)
	commitErr := make(chan error, 1)
	go func() {
		var err error
		for next := range offsets {
			if err == nil {
				err = gen.CommitOffsets(map[string]map[int]int64{topic: {a.ID: next}})
			}
		}
		commitErr <- err
	}()
	commit = func(next int64) {
		select {
		case offsets <- next:
		case <-offsets: // replaced by the newer offset
			offsets <- next
		}
	}
	wait = func() error {
		close(offsets)
		return <-commitErr
	}
	return commit, wait
}

// classicInboxPartition applies one assigned partition message by message,
// each in a transaction with its inbox row, as KafkaClassicInbox describes.
func classicInboxPartition(ctx context.Context, f *Fixture, brokers []string, topic string, a kafka.PartitionAssignment, gen *kafka.Generation, _ int, committed func(int)) (err error) {
	r, err := libraryFreeReader(brokers, topic, a)
	if err != nil {
		return err
	}
	defer r.Close()
	commit, wait := libraryFreeCommitter(topic, a, gen)
	defer func() {
		if cerr := wait(); err == nil {
			err = cerr
		}
	}()
	claim := `INSERT INTO ` + f.Dedup + ` (consumer, event_id, processed_at) VALUES (?, ?, ?) ON CONFLICT (consumer, event_id) DO NOTHING`
	if f.Backend.Dialect == MySQL {
		claim = `INSERT IGNORE INTO ` + f.Dedup + ` (consumer, event_id, processed_at) VALUES (?, ?, ?)`
	}
	for ctx.Err() == nil {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return err
		}
		sku, err := strconv.ParseInt(string(m.Key), 10, 64)
		if err != nil {
			return fmt.Errorf("bench: offset %d: key %q: %w", m.Offset, m.Key, err)
		}
		var id string
		for _, h := range m.Headers {
			if h.Key == header.EventID {
				id = string(h.Value)
			}
		}
		if id == "" {
			return fmt.Errorf("bench: offset %d: no event id", m.Offset)
		}
		if err := f.Backend.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			res := tx.Exec(claim, ConsumerName, id, time.Now().UTC())
			if res.Error != nil || res.RowsAffected == 0 {
				return res.Error // seen before: nothing to apply
			}
			return f.effect(tx, sku)
		}); err != nil {
			return err
		}
		commit(m.Offset + 1)
		committed(1)
	}
	return ctx.Err()
}
