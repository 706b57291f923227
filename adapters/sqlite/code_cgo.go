//go:build cgo

package sqlite

import (
	"errors"

	"github.com/mattn/go-sqlite3"
)

// ErrorCode returns the primary SQLite result code of err (SQLITE_BUSY is
// 5), and false if err is not an error of the SQLite driver.
func ErrorCode(err error) (int, bool) {
	var se sqlite3.Error
	if errors.As(err, &se) {
		return int(se.Code), true
	}
	return 0, false
}
