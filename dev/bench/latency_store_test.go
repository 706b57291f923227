package bench

import (
	"fmt"
	"testing"

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
