//go:build cgo

package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/outbox"
	"github.com/inboxgo/inbox/storage"
)

// countSignal is a pinRecorder that tells when the relay asks for the
// partition count, and counts the asks.
type countSignal struct {
	*pinRecorder
	asked chan struct{}
	asks  atomic.Int64
}

func (p *countSignal) Partitions(ctx context.Context, topic string) (int, error) {
	p.asks.Add(1)
	select {
	case p.asked <- struct{}{}:
	default:
	}
	return p.pinRecorder.Partitions(ctx, topic)
}

// gatedClaims is an outbox store whose claims, while gate is set, wait
// (up to a second) for the relay to ask for the partition count, and note
// whether it did meanwhile.
type gatedClaims struct {
	*inboxsqlite.OutboxStore
	gate       atomic.Bool
	asked      <-chan struct{}
	overlapped atomic.Int64
	waitedOut  atomic.Int64
}

func (s *gatedClaims) Claim(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, error) {
	s.wait()
	return s.OutboxStore.Claim(ctx, db, req)
}

func (s *gatedClaims) ClaimSource(ctx context.Context, db *gorm.DB, req storage.ClaimRequest) ([]storage.OutboxRow, string, int64, error) {
	s.wait()
	return s.OutboxStore.ClaimSource(ctx, db, req)
}

func (s *gatedClaims) wait() {
	if s.gate.Load() {
		select {
		case <-s.asked:
			s.overlapped.Add(1)
		case <-time.After(time.Second):
			s.waitedOut.Add(1)
		}
	}
}

// Under a stream of commits an aligned relay asks for its topic's
// partition count while it claims, so the broker's answer does not add to
// the cycle; after a cycle that found nothing it asks only once a claim
// found rows, so an idle relay sends the broker nothing.
func TestAlignedRelayReadsThePartitionCountWhileItClaims(t *testing.T) {
	ctx := t.Context()
	const shards = 4
	db, sqliteStore := alignedSQLite(t, shards)
	pub := &countSignal{pinRecorder: &pinRecorder{count: shards}, asked: make(chan struct{}, 1)}
	store := &gatedClaims{OutboxStore: sqliteStore, asked: pub.asked}
	ob := newOutbox(t, db, store, outbox.Config{AlignedTopic: "orders"})
	relay, err := ob.NewRelay(pub, outbox.RelayConfig{ID: "r", MaxMessages: 25})
	if err != nil {
		t.Fatal(err)
	}
	if err := enqueue(ctx, db, ob, alignedMessages("orders", 0, 10, 5)...); err != nil {
		t.Fatal(err)
	}
	if n, err := relay.PublishOnce(ctx); err != nil || n != 10 {
		t.Fatalf("first cycle: published %d, %v; want 10", n, err)
	}
	if err := enqueue(ctx, db, ob, alignedMessages("orders", 10, 10, 5)...); err != nil {
		t.Fatal(err)
	}
	// Whatever the first cycle left in the channel is not this cycle's ask.
	select {
	case <-pub.asked:
	default:
	}
	store.gate.Store(true)
	n, err := relay.PublishOnce(ctx)
	store.gate.Store(false)
	if err != nil || n != 10 {
		t.Fatalf("second cycle: published %d, %v; want 10", n, err)
	}
	if store.overlapped.Load() != 1 || store.waitedOut.Load() != 0 {
		t.Errorf("the claim after a cycle that published saw the count asked for during it %d times and waited in vain %d times; want once and never",
			store.overlapped.Load(), store.waitedOut.Load())
	}
	if n, err := conformance.Drain(ctx, relay); err != nil || n != 0 {
		t.Fatalf("drain: %d, %v; want nothing left", n, err)
	}
	before := pub.asks.Load()
	for range 3 {
		if n, err := relay.PublishOnce(ctx); err != nil || n != 0 {
			t.Fatalf("idle cycle: published %d, %v", n, err)
		}
	}
	if asks := pub.asks.Load() - before; asks != 0 {
		t.Errorf("an idle relay asked for the partition count %d times in 3 cycles that found nothing, want 0", asks)
	}
	got, _ := pub.published()
	if len(got) != 20 {
		t.Errorf("published %d messages, want 20", len(got))
	}
}
