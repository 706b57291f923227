package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/outbox"
)

// holdingPublisher publishes, and when armed waits after a publish, before
// the relay acknowledges it, until released: a relay with a cycle in flight
// while the database is restored.
type holdingPublisher struct {
	*outbox.KafkaPublisher
	mu      sync.Mutex
	armed   bool
	held    chan struct{}
	release chan struct{}
}

func (p *holdingPublisher) PublishPinned(ctx context.Context, msgs []kafka.Message, parts []int, n int) error {
	err := p.KafkaPublisher.PublishPinned(ctx, msgs, parts, n)
	p.mu.Lock()
	armed := p.armed
	p.armed = false
	p.mu.Unlock()
	if armed {
		close(p.held)
		<-p.release
	}
	return err
}

// TestRelayAckAcrossRestore: a relay publishes rows of an aligned outbox,
// and before it marks them published the producer's database is restored
// from a backup taken when those rows did not exist yet (the shard idle,
// the same relay owning it). Its acknowledgement must not move the
// restored mark over numbers the restored database hands out again: the
// events enqueued after the restore must all be published.
func TestRelayAckAcrossRestore(t *testing.T) {
	for _, be := range chainBackends {
		t.Run(be.name, func(t *testing.T) {
			c := be.open(t)
			brokers := testservers.KafkaBrokers(t)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			sfx := conformance.RandomSuffix()
			topic := "ackrestore-" + sfx
			if err := inventory.CreateTopic(ctx, brokers[0], topic, 16); err != nil {
				t.Fatal(err)
			}
			obTable := "outbox_ar_" + sfx
			ob, _ := alignedOutbox(ctx, t, c, obTable, topic)
			w := outbox.NewKafkaWriter(brokers...)
			defer w.Close()
			kp, err := outbox.NewKafkaPublisher(w)
			if err != nil {
				t.Fatal(err)
			}
			hp := &holdingPublisher{KafkaPublisher: kp, held: make(chan struct{}), release: make(chan struct{})}
			r, err := ob.NewRelay(hp, outbox.RelayConfig{ID: "relay-1", Lease: 3 * time.Second, MaxMessages: 50, PollInterval: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			rctx, rstop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			wg.Go(func() { _ = r.Run(rctx) })
			defer wg.Wait()
			defer rstop()
			enqueue := func(prefix string, n int) {
				msgs := make([]outbox.Message, n)
				for i := range msgs {
					msgs[i] = outbox.Message{Topic: topic, Key: []byte("k"), Value: []byte(`{}`), ID: fmt.Sprintf("%s-%03d", prefix, i)}
				}
				if err := c.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return ob.Enqueue(ctx, tx, msgs...) }); err != nil {
					t.Fatal(err)
				}
			}
			var ids []string
			scan := func() inventory.TopicScan {
				s, err := inventory.ScanTopic(ctx, brokers, topic, 16, ids)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			enqueue("old", 30)
			time.Sleep(2 * time.Second)
			tables := []string{obTable, obTable + "_shards", obTable + "_source"}
			if c.db.Name() != "sqlite" {
				tables = append(tables, obTable+"_relay")
			}
			for _, table := range tables {
				c.drop("bak_" + table)
				if err := c.db.Exec(`CREATE TABLE ` + c.qualify("bak_"+table) + ` AS SELECT * FROM ` + c.qualify(table)).Error; err != nil {
					t.Fatal(err)
				}
			}
			hp.mu.Lock()
			hp.armed = true
			hp.mu.Unlock()
			enqueue("gone", 10) // published, then taken back by the restore before the relay acknowledges them
			select {
			case <-hp.held:
			case <-ctx.Done():
				t.Fatal("the relay never published")
			}
			err = c.db.Transaction(func(tx *gorm.DB) error {
				for _, table := range tables {
					if err := tx.Exec(`DELETE FROM ` + c.qualify(table)).Error; err != nil {
						return err
					}
					if err := tx.Exec(`INSERT INTO ` + c.qualify(table) + ` SELECT * FROM ` + c.qualify("bak_"+table)).Error; err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			close(hp.release)
			time.Sleep(time.Second)
			enqueue("new", 10)
			for i := range 10 {
				ids = append(ids, fmt.Sprintf("new-%03d", i))
			}
			deadline := time.Now().Add(15 * time.Second)
			for time.Now().Before(deadline) && scan().Missing > 0 {
				time.Sleep(500 * time.Millisecond)
			}
			if s := scan(); s.Missing > 0 {
				t.Errorf("%d of the 10 events enqueued after the restore never published", s.Missing)
			}
		})
	}
}
