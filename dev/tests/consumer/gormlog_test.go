package consumer_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/consumer"
)

// sqlRecorder is an application's GORM logger: it records every statement
// it is given, and every error.
type sqlRecorder struct {
	mu    sync.Mutex
	stmts []string
}

func (r *sqlRecorder) LogMode(logger.LogLevel) logger.Interface { return r }
func (r *sqlRecorder) Info(context.Context, string, ...any)     {}
func (r *sqlRecorder) Warn(context.Context, string, ...any)     {}
func (r *sqlRecorder) Error(context.Context, string, ...any)    {}
func (r *sqlRecorder) Trace(_ context.Context, _ time.Time, fc func() (string, int64), err error) {
	sql, _ := fc()
	if err != nil {
		sql += " -- error: " + err.Error()
	}
	r.mu.Lock()
	r.stmts = append(r.stmts, sql)
	r.mu.Unlock()
}

func (r *sqlRecorder) reset() {
	r.mu.Lock()
	r.stmts = nil
	r.mu.Unlock()
}

func (r *sqlRecorder) recorded() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.stmts...)
}

// The library's own statements (migrations, claims, the stored offset
// read on a new assignment, which finds none, and its writes) do not go
// through the application's GORM logger; the handler's statements, in the
// same transaction, do.
func TestOwnStatementsBypassTheApplicationsGORMLogger(t *testing.T) {
	for name, idempotent := range map[string]bool{"inbox": false, "naturally idempotent": true} {
		t.Run(name, func(t *testing.T) {
			rec := &sqlRecorder{}
			db, err := gorm.Open(inboxsqlite.Open(filepath.Join(t.TempDir(), "shop.db")), &gorm.Config{Logger: rec})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if sqlDB, err := db.DB(); err == nil {
					sqlDB.Close()
				}
			})
			store, err := inboxsqlite.New(inboxsqlite.Options{})
			if err != nil {
				t.Fatal(err)
			}
			s := setupShop(t, db, store, "")
			rec.reset() // the shop's own set-up
			brokers := newKfake(t, 1, "orders")
			produce(t, brokers, "orders", orderMessage(0, 0), orderMessage(1, 0))
			cfg := consumer.Config{
				Brokers: brokers, GroupID: "inventory", Topics: []string{"orders"},
				Inbox: s.ib, Consumer: "reserve", Offsets: consumer.OffsetsConfig{Store: true},
				Handler: s.reserve, Logger: testLogger(t),
			}
			if idempotent {
				cfg.Inbox, cfg.DB, cfg.Classifier, cfg.NaturallyIdempotent = nil, db, store, true
			}
			r := start(t, cfg)
			waitUntil(t, 20*time.Second, "both orders reserved", func() bool {
				var n int64
				return s.db.Table("reservations").Count(&n).Error == nil && n == 2
			})
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}

			handlers := 0
			for _, q := range rec.recorded() {
				switch {
				case strings.Contains(q, "INSERT INTO reservations"), strings.Contains(q, "UPDATE stock"):
					handlers++
				case strings.Contains(q, "SELECT count(*) FROM `reservations`"): // the test's poll
				default:
					t.Errorf("the application's logger got the library's statement %q", q)
				}
			}
			if handlers != 4 {
				t.Errorf("the application's logger got %d statements of the handler, want 4: %q", handlers, rec.recorded())
			}
		})
	}
}
