package main

import (
	"net/url"
	"strings"
)

// sqlitePath returns the file name of a go-sqlite3 DSN: a plain name, or a
// file: URI whose authority, if any, is empty or localhost.
func sqlitePath(dsn string) string {
	path, _, _ := strings.Cut(dsn, "?")
	if rest, ok := strings.CutPrefix(path, "file:"); ok {
		path = rest
		if rest, ok := strings.CutPrefix(path, "//"); ok {
			_, path, _ = strings.Cut(rest, "/")
			path = "/" + path
		}
		if p, err := url.PathUnescape(path); err == nil {
			path = p
		}
	}
	return path
}

func sqliteCheckDSN(dsn string) error {
	if strings.Contains(dsn, ":memory:") || strings.Contains(dsn, "mode=memory") {
		return usageErrorf("an in-memory SQLite database lives only as long as its connection; give the database file")
	}
	return nil
}
