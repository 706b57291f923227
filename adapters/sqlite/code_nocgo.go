//go:build !cgo

package sqlite

// ErrorCode returns the primary SQLite result code of err, and false if err
// is not an error of the SQLite driver. Built without cgo there is no
// SQLite driver (go-sqlite3 needs cgo: opening a database fails with its
// error saying so), so it is never one.
func ErrorCode(error) (int, bool) { return 0, false }

// noSuchTable is false: without cgo no error is the SQLite driver's.
func noSuchTable(error) bool { return false }
