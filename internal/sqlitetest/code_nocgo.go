//go:build !cgo

package sqlitetest

// Without cgo there is no SQLite driver (Open fails saying so).
func errorCode(error) (int, bool) { return 0, false }
