package bench

import (
	"fmt"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/storage"
)

// The timed store must look like the store it wraps to the relay, or the
// benchmark would time a relay that takes another path.
func TestTimedOutboxKeepsTheStoresInterfaces(t *testing.T) {
	pg, err := inboxpg.NewOutbox(inboxpg.OutboxOptions{Table: "t", Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	my, err := inboxmysql.NewOutbox(inboxmysql.OutboxOptions{Table: "t", Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	lite, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Table: "t", Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	interfaces := func(s storage.OutboxStore) string {
		_, sc := s.(storage.SourceClaimer)
		_, n := s.(storage.Notifier)
		_, sq := s.(storage.Sequenced)
		_, mt := s.(storage.MissingTableReporter)
		_, tb := s.(interface{ Table() string })
		_, sh := s.(storage.Sharded)
		_, mr := s.(storage.MarkReader)
		return fmt.Sprint(sc, n, sq, mt, tb, sh, mr)
	}
	var times relayTimes
	for _, s := range []storage.OutboxStore{pg, my, lite} {
		timed := times.timed(s)
		if timed == s {
			t.Fatalf("%T is not wrapped", s)
		}
		if got, want := interfaces(timed), interfaces(s); got != want {
			t.Errorf("%T wrapped: SourceClaimer, Notifier, Sequenced, MissingTableReporter, Table, Sharded, MarkReader = %s, want %s", s, got, want)
		}
	}
	if got := interfaces(times.timed(pg)); got != "true true true true true true true" {
		t.Errorf("the PostgreSQL store wrapped: %s, want every interface", got)
	}
}

// A claim through the timed SQLite store is timed, whichever of Claim and
// ClaimSource the relay calls: a method the wrapper does not declare is
// the store's own, and untimed.
func TestTimedSQLiteOutboxTimesEveryClaim(t *testing.T) {
	b, err := OpenSQLite(1, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	db := b.DB
	store, err := inboxsqlite.NewOutbox(inboxsqlite.OutboxOptions{Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := store.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	var times relayTimes
	timed := times.timed(store)
	req := storage.ClaimRequest{Relay: "timed", Lease: time.Minute, MaxRows: 10}
	claims := map[string]func() ([]storage.OutboxRow, error){
		"Claim": func() ([]storage.OutboxRow, error) { return timed.Claim(ctx, db, req) },
		"ClaimSource": func() ([]storage.OutboxRow, error) {
			rows, _, _, err := timed.(storage.SourceClaimer).ClaimSource(ctx, db, req)
			return rows, err
		},
	}
	for i, name := range []string{"Claim", "ClaimSource"} {
		row := storage.OutboxRow{KeyHash: uint32(i), Day: storage.DayOf(time.Now()), EventID: name, Topic: "t", Value: []byte("v"), Headers: []byte("[]")}
		if err := db.Transaction(func(tx *gorm.DB) error { return store.Append(ctx, tx, []storage.OutboxRow{row}) }); err != nil {
			t.Fatal(err)
		}
		rows, err := claims[name]()
		if err != nil || len(rows) == 0 {
			t.Fatalf("%s: %d rows, %v", name, len(rows), err)
		}
		if got := len(times.claim.d); got != i+1 {
			t.Errorf("after %s: %d claims timed, want %d", name, got, i+1)
		}
		if err := timed.Ack(ctx, db, "timed", []storage.Mark{{Shard: rows[len(rows)-1].Shard, Seq: rows[len(rows)-1].Seq}}); err != nil {
			t.Fatal(err)
		}
	}
}
