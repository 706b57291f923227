//go:build !cgo

package main

func init() {
	unavailable[dialectSQLite] = "this inboxctl was built without cgo (CGO_ENABLED=0), and SQLite's driver needs cgo: build it with CGO_ENABLED=1 and a C compiler"
}
