//go:build cgo

package sqlite

import (
	"errors"
	"strings"

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

// noSuchTable reports whether err is SQLite's "no such table" error: the
// generic SQLITE_ERROR (SQLite has no code of its own for it) whose text
// starts so.
func noSuchTable(err error) bool {
	var se sqlite3.Error
	return errors.As(err, &se) && se.Code == sqlite3.ErrError && strings.HasPrefix(se.Error(), "no such table: ")
}
