package txn

import (
	"context"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The library's own statements (claims, watermarks, stored offsets,
// migrations, maintenance) are not the application's: an application's
// GORM logger would show them as its own, "record not found" for a
// partition without a stored offset, "SLOW SQL" for a claim. So the
// *gorm.DB the library runs them on is [Quiet]: its logger logs nothing.
// The transactions begun on it are quiet too, and a handler, which runs
// the application's statements in such a transaction, receives it through
// [ForApplication], with the application's logger back.

// quietLogger logs nothing, and keeps the logger it replaced for
// ForApplication.
type quietLogger struct{ app logger.Interface }

func (q quietLogger) LogMode(logger.LogLevel) logger.Interface                      { return q }
func (quietLogger) Info(context.Context, string, ...any)                            {}
func (quietLogger) Warn(context.Context, string, ...any)                            {}
func (quietLogger) Error(context.Context, string, ...any)                           {}
func (quietLogger) Trace(context.Context, time.Time, func() (string, int64), error) {}

// Quiet returns db for the library's own statements: a session of db whose
// GORM logger logs nothing. db itself is not changed. Quiet of a quiet
// *gorm.DB returns it as it is.
func Quiet(db *gorm.DB) *gorm.DB {
	if db == nil || db.Config == nil {
		return db
	}
	if _, ok := db.Logger.(quietLogger); ok {
		return db
	}
	return db.Session(&gorm.Session{Logger: quietLogger{app: db.Logger}})
}

// ForApplication returns tx, a transaction the library runs the
// application's statements in, as the application's handler is to get it:
// if tx is [Quiet], with the logger Quiet replaced.
func ForApplication(tx *gorm.DB) *gorm.DB {
	if q, quiet := tx.Logger.(quietLogger); quiet {
		return tx.Session(&gorm.Session{Logger: q.app})
	}
	return tx
}

// ForApplicationUnder is [ForApplication] under ctx, in one session.
func ForApplicationUnder(ctx context.Context, tx *gorm.DB) *gorm.DB {
	if q, quiet := tx.Logger.(quietLogger); quiet {
		return tx.Session(&gorm.Session{Context: ctx, Logger: q.app})
	}
	return tx.WithContext(ctx)
}

// quietSession is [Quiet] of db under ctx, in one session.
func quietSession(ctx context.Context, db *gorm.DB) *gorm.DB {
	if _, ok := db.Logger.(quietLogger); ok {
		return db.WithContext(ctx)
	}
	return db.Session(&gorm.Session{Context: ctx, Logger: quietLogger{app: db.Logger}})
}
