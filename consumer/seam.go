package consumer

import (
	"context"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/internal/seam"
)

// The project's own tests live in another module (they need a driver and an
// in-process broker); internal/seam is how they reach what they check here.
func init() {
	seam.ErrCrash = errCrash
	seam.ErrPositionMoved = errPositionMoved
	seam.DeadLetterUnknownTopicAttempts = deadLetterUnknownTopicAttempts
	seam.SetAfterDB = func(cfg any, hook seam.AfterDB) { cfg.(*Config).afterDB = hook }
	seam.SetLogCheckInterval = func(cfg any, every time.Duration) { cfg.(*Config).logCheckInterval = every }
	seam.SetPosCheckInterval = func(cfg any, every time.Duration) { cfg.(*Config).posCheckInterval = every }
	seam.NewOffsetStore = func(table, group string) seam.OffsetStore {
		return seamOffsets{offsetStore{table: table, group: group}}
	}
	seam.OffsetsOf = func(c any) seam.OffsetStore { return seamOffsets{c.(*Consumer).offsets} }
}

type seamOffsets struct{ s offsetStore }

func (o seamOffsets) Table() string { return o.s.table }

func (o seamOffsets) Migrate(ctx context.Context, db *gorm.DB) error { return o.s.migrate(ctx, db) }

func (o seamOffsets) Save(ctx context.Context, tx *gorm.DB, topic string, partition int, next int64) error {
	return o.s.save(ctx, tx, topic, partition, next)
}

func (o seamOffsets) Advance(ctx context.Context, tx *gorm.DB, topic string, partition int, floor, next int64) error {
	return o.s.advance(ctx, tx, topic, partition, floor, next)
}

func (o seamOffsets) Load(ctx context.Context, db *gorm.DB, topic string, partition int) (int64, error) {
	return o.s.load(ctx, db, topic, partition)
}
