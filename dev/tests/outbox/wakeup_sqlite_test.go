//go:build cgo

package outbox_test

import (
	"testing"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
)

func TestRelayWakesInProcessSQLite(t *testing.T) {
	db, store := sequenceDB(t)
	ibStore, err := inboxsqlite.New(inboxsqlite.Options{Table: "wake_inbox"})
	if err != nil {
		t.Fatal(err)
	}
	runWakesInProcess(t, db, store, ibStore)
}
