//go:build cgo

package sqlitetest

import (
	"errors"

	"github.com/mattn/go-sqlite3"
)

func errorCode(err error) (int, bool) {
	var se sqlite3.Error
	if errors.As(err, &se) {
		return int(se.Code), true
	}
	return 0, false
}
