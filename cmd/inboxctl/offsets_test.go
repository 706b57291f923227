package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/storage"
)

func TestOffsetsSQLite(t *testing.T) {
	path := emptySQLite(t)
	expectOffsets(t, dialectSQLite, path)
}

func TestOffsetsPostgres(t *testing.T) {
	expectOffsets(t, dialectPostgres, testservers.PostgresDSN(t))
}

func TestOffsetsMySQL(t *testing.T) {
	expectOffsets(t, dialectMySQL, mysqlDSN(t, nil))
}

type offsetsJSON struct {
	Group      string             `json:"group"`
	GroupState string             `json:"group_state"`
	Partitions []partitionOffsets `json:"partitions"`
}

// expectOffsets shows and resets a group's stored offsets in an offsets
// table of dialect, made as the consumer makes it, against a real broker.
func expectOffsets(t *testing.T, dialect, dsn string) {
	brokers := testBrokers(t)
	b := brokersArg(brokers)
	topic := newTopic(t, brokers, "orders", 2)
	group := "billing-" + topic
	table := "inboxctl_offsets_" + conformance.RandomSuffix()
	db := openGorm(t, dialect, dsn)
	t.Cleanup(func() { _ = db.Migrator().DropTable(table) })
	store := groupOffsets{Table: table, Group: group}
	if err := store.Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	// Partition 0: 5 messages a minute apart from an hour ago; partition 1:
	// 3 messages from 90 s after the first.
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	var msgs []kafka.Message
	for i := range 5 {
		msgs = append(msgs, kafka.Message{Partition: 0, Value: []byte("p0"), Time: t0.Add(time.Duration(i) * time.Minute)})
	}
	for i := range 3 {
		msgs = append(msgs, kafka.Message{Partition: 1, Value: []byte("p1"), Time: t0.Add(90*time.Second + time.Duration(i)*time.Minute)})
	}
	produce(t, brokers, topic, msgs...)
	// Partition 0 stored at 5 by generation 3, with the fingerprint of the
	// message before; another group's row beside it.
	if err := store.Save(t.Context(), db, topic, 0, storage.OffsetWrite{Next: 5, Generation: 3, Last: 12345}); err != nil {
		t.Fatal(err)
	}
	if err := (groupOffsets{Table: table, Group: "other"}).Save(t.Context(), db, topic, 0, storage.OffsetWrite{Next: 1, Generation: 1}); err != nil {
		t.Fatal(err)
	}
	base := []string{"--dsn", dsn, "--dialect", dialect, "--table", table, "--group", group}
	run := func(args ...string) result {
		t.Helper()
		return runArgs(t, append(args, base...)...)
	}
	stored := func(p int) (storage.OffsetRow, bool) {
		t.Helper()
		row, found, err := store.Read(t.Context(), db, topic, p)
		if err != nil {
			t.Fatal(err)
		}
		return row, found
	}
	expectStored := func(what string, p int, next int64, gen int32) {
		t.Helper()
		row, found := stored(p)
		if !found || row.Next != next || row.Generation != gen || row.Last != 0 {
			t.Fatalf("%s: %s/%d stored %+v (found %v), want next %d, generation %d, no fingerprint", what, topic, p, row, found, next, gen)
		}
	}
	committed := func(p int) int64 {
		t.Helper()
		res, err := newKafkaClient(brokers).c.OffsetFetch(t.Context(), &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: {p}}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Topics[topic][0].CommittedOffset
	}

	// show, without and with the brokers.
	t.Setenv(brokersEnv, "")
	r := run("offsets", "show")
	expectCode(t, r, exitOK)
	for _, want := range []string{"offsets table " + table + ", group " + group, "TOPIC", topic + "  0          5       3           yes"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("show lacks %q:\n%v", want, r)
		}
	}
	if strings.Contains(r.stdout, "LOG END") {
		t.Errorf("show without brokers has Kafka columns:\n%v", r)
	}
	r = run("offsets", "show", "--brokers", b, "--json")
	expectCode(t, r, exitOK)
	got := decodeJSON[offsetsJSON](t, r)
	if len(got.Partitions) != 2 {
		t.Fatalf("show --brokers: want both partitions, got %v", r)
	}
	p0, p1 := got.Partitions[0], got.Partitions[1]
	if p0.Stored == nil || *p0.Stored != 5 || !p0.Fingerprinted || *p0.LogEnd != 5 || *p0.LogStart != 0 || *p0.Lag != 0 || p0.Committed != nil {
		t.Errorf("show partition 0: %+v", p0)
	}
	if p1.Stored != nil || *p1.LogEnd != 3 || p1.Lag != nil {
		t.Errorf("show partition 1 (no row): %+v", p1)
	}
	r = runArgs(t, "offsets", "show", "--dsn", dsn, "--dialect", dialect, "--table", table, "--group", "nobody")
	expectCode(t, r, exitFailed)
	if !strings.Contains(r.stderr, "group nobody has no stored offset in "+table) {
		t.Errorf("unknown group:\n%v", r)
	}

	// A dry run changes nothing.
	r = run("offsets", "reset", "--brokers", b, "--topic", topic, "--partition", "0", "--to-offset", "2", "--dry-run")
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "reset plan (dry run, nothing changed)") || !strings.Contains(r.stdout, "NEW") {
		t.Errorf("dry run:\n%v", r)
	}
	if row, _ := stored(0); row.Next != 5 || row.Last != 12345 {
		t.Fatalf("dry run changed the row: %+v", row)
	}
	if c := committed(0); c != -1 {
		t.Fatalf("dry run committed %d to the group", c)
	}

	// --to-offset: the row moves, its fingerprint goes, its generation
	// stays; the group's offset in Kafka follows.
	r = run("offsets", "reset", "--brokers", b, "--topic", topic, "--partition", "0", "--to-offset", "2")
	expectCode(t, r, exitOK)
	expectStored("--to-offset 2", 0, 2, 3)
	if _, found := stored(1); found {
		t.Fatalf("--partition 0 reset partition 1 too")
	}
	if c := committed(0); c != 2 {
		t.Errorf("the group's committed offset is %d, want 2", c)
	}
	if row, _, _ := (groupOffsets{Table: table, Group: "other"}).Read(t.Context(), db, topic, 0); row.Next != 1 {
		t.Errorf("another group's row changed: %+v", row)
	}

	// --to-start, --to-end, --to-time: every partition, rows created.
	r = run("offsets", "reset", "--brokers", b, "--topic", topic, "--to-start")
	expectCode(t, r, exitOK)
	expectStored("--to-start", 0, 0, 3)
	expectStored("--to-start", 1, 0, 0)
	r = run("offsets", "reset", "--brokers", b, "--topic", topic, "--to-end", "--json")
	expectCode(t, r, exitOK)
	if got := decodeJSON[offsetsJSON](t, r); len(got.Partitions) != 2 || *got.Partitions[0].New != 5 || *got.Partitions[1].New != 3 || *got.Partitions[0].Stored != 0 {
		t.Errorf("--to-end --json: %v", r)
	}
	expectStored("--to-end", 0, 5, 3)
	expectStored("--to-end", 1, 3, 0)
	r = run("offsets", "reset", "--brokers", b, "--topic", topic, "--to-time", t0.Add(2*time.Minute).UTC().Format(time.RFC3339))
	expectCode(t, r, exitOK)
	expectStored("--to-time", 0, 2, 3) // t0+2m is offset 2
	expectStored("--to-time", 1, 1, 0) // t0+90s, t0+150s: the second
	if c0, c1 := committed(0), committed(1); c0 != 2 || c1 != 1 {
		t.Errorf("the group's committed offsets are %d, %d, want 2, 1", c0, c1)
	}
	r = run("offsets", "reset", "--brokers", b, "--topic", topic, "--to-time", time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	expectCode(t, r, exitOK)
	expectStored("--to-time in the future", 0, 5, 3)
	expectStored("--to-time in the future", 1, 3, 0)

	// Past the log end: refused, nothing changed.
	r = run("offsets", "reset", "--brokers", b, "--topic", topic, "--to-offset", "99")
	expectCode(t, r, exitFailed)
	if !strings.Contains(r.stderr, "--to-offset 99 is past the log end 5 of "+topic+"/0") {
		t.Errorf("past the log end:\n%v", r)
	}
	expectStored("refused reset", 0, 5, 3)

	// A group with a member: refused, naming it.
	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: group, Topic: topic, MaxWait: 100 * time.Millisecond, StartOffset: kafka.FirstOffset})
	defer rd.Close()
	ctx, cancel := context.WithCancel(t.Context())
	fetched := make(chan struct{})
	go func() { defer close(fetched); _, _ = rd.FetchMessage(ctx) }() // joins the group; nothing to fetch
	defer func() { cancel(); <-fetched }()
	waitFor(t, 60*time.Second, "the reader to join the group", func() bool {
		_, members, err := newKafkaClient(brokers).groupMembers(t.Context(), group)
		return err == nil && len(members) == 1
	})
	r = run("offsets", "reset", "--brokers", b, "--topic", topic, "--to-start")
	expectCode(t, r, exitFailed)
	if !strings.Contains(r.stderr, "group "+group+" has 1 member(s)") || !strings.Contains(r.stderr, "stop its consumers first") {
		t.Errorf("reset with a member:\n%v", r)
	}
	expectStored("refused reset", 0, 5, 3)
	cancel()
	<-fetched
	rd.Close()

	// Without brokers: --to-offset only, with a warning.
	r = run("offsets", "reset", "--topic", topic, "--partition", "1", "--to-offset", "1")
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stderr, "warning: without --brokers the group's members cannot be checked") {
		t.Errorf("reset without brokers:\n%v", r)
	}
	expectStored("reset without brokers", 1, 1, 0)
	r = run("offsets", "reset", "--topic", topic, "--to-end")
	expectCode(t, r, exitUsage)
	expectOffsetsUsage(t, dsn, dialect, table)
}

func expectOffsetsUsage(t *testing.T, dsn, dialect, table string) {
	t.Helper()
	base := []string{"--dsn", dsn, "--dialect", dialect, "--table", table}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"offsets"}, "missing action: show or reset"},
		{[]string{"offsets", "show"}, "--group is required"},
		{[]string{"offsets", "reset", "--group", "g"}, "--topic is required for reset"},
		{[]string{"offsets", "reset", "--group", "g", "--topic", "t"}, "reset takes exactly one of"},
		{[]string{"offsets", "reset", "--group", "g", "--topic", "t", "--to-start", "--to-end"}, "reset takes exactly one of"},
		{[]string{"offsets", "reset", "--group", "g", "--topic", "t", "--to-offset", "-3"}, "--to-offset must not be negative"},
		{[]string{"offsets", "show", "--group", "g", "--to-end"}, "are for reset"},
		{[]string{"offsets", "show", "--group", "g", "--schema", "app"}, "--schema is not taken"},
	} {
		r := runArgs(t, append(c.args, base...)...)
		expectCode(t, r, exitUsage)
		if !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: stderr lacks %q:\n%v", c.args, c.want, r)
		}
	}
	r := runArgs(t, "offsets", "show", "--group", "g", "--dsn", dsn, "--dialect", dialect, "--table", "no_such_offsets")
	expectCode(t, r, exitFailed)
	if !strings.Contains(r.stderr, "no offsets table no_such_offsets") {
		t.Errorf("missing table:\n%v", r)
	}
}

// TestOffsetsShowDeletedTopic: a stored offset of a topic that no longer
// exists is shown, with a note, rather than failing the whole show.
func TestOffsetsShowDeletedTopic(t *testing.T) {
	brokers := testBrokers(t)
	topic := newTopic(t, brokers, "orders", 1)
	gone := "gone-" + conformance.RandomSuffix()
	path := emptySQLite(t)
	db := openGorm(t, dialectSQLite, path)
	store := groupOffsets{Table: defaultOffsetsTable, Group: "billing"}
	if err := store.Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	for _, tp := range []string{topic, gone} {
		if err := store.Save(t.Context(), db, tp, 0, storage.OffsetWrite{Next: 4, Generation: 1}); err != nil {
			t.Fatal(err)
		}
	}
	r := runArgs(t, "offsets", "show", "--dsn", path, "--group", "billing", "--brokers", brokersArg(brokers), "--json")
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stderr, "topic "+gone+" does not exist: its stored offsets are shown without the log's") {
		t.Errorf("no note about the deleted topic:\n%v", r)
	}
	got := decodeJSON[offsetsJSON](t, r)
	if len(got.Partitions) != 2 {
		t.Fatalf("want both rows:\n%v", r)
	}
	for _, po := range got.Partitions {
		switch po.Topic {
		case gone:
			if po.LogEnd != nil || *po.Stored != 4 {
				t.Errorf("deleted topic's row: %+v", po)
			}
		case topic:
			if po.LogEnd == nil || *po.LogEnd != 0 || *po.Lag != -4 {
				t.Errorf("live topic's row: %+v", po)
			}
		}
	}
	r = runArgs(t, "offsets", "show", "--dsn", path, "--group", "billing", "--brokers", brokersArg(brokers))
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, topic+"/0: the stored offset 4 is past the log end 0 (was the topic recreated?)") {
		t.Errorf("no note about the offset past the log end:\n%v", r)
	}
	r = runArgs(t, "offsets", "reset", "--dsn", path, "--group", "billing", "--brokers", brokersArg(brokers), "--topic", gone, "--to-start")
	expectCode(t, r, exitFailed)
	if !strings.Contains(r.stderr, "topic "+gone+" does not exist") {
		t.Errorf("reset of a deleted topic:\n%v", r)
	}
}

// groupOffsets is a group's rows in an offsets table, through the
// storage.OffsetStore of the database's adapter, as the consumer keeps
// them.
type groupOffsets struct{ Table, Group string }

func offsetStoreOf(db *gorm.DB) storage.OffsetStore {
	s, err := backends[db.Name()].newStore(backends[db.Name()].defaultTable, "")
	if err != nil {
		panic(err)
	}
	return s.(storage.OffsetStore)
}

func (g groupOffsets) Migrate(ctx context.Context, db *gorm.DB) error {
	return offsetStoreOf(db).MigrateOffsets(ctx, db, g.Table)
}

// Save stores w as the first write of a member: no floor.
func (g groupOffsets) Save(ctx context.Context, db *gorm.DB, topic string, partition int, w storage.OffsetWrite) error {
	w.OffsetKey, w.Floor = storage.OffsetKey{Group: g.Group, Topic: topic, Partition: int32(partition)}, -1
	return offsetStoreOf(db).SaveOffset(ctx, db, g.Table, w)
}

func (g groupOffsets) Read(ctx context.Context, db *gorm.DB, topic string, partition int) (storage.OffsetRow, bool, error) {
	rows, err := offsetStoreOf(db).Offsets(ctx, db, g.Table, g.Group, topic, int32(partition))
	if err != nil || len(rows) == 0 {
		return storage.OffsetRow{}, false, err
	}
	return rows[0], true, nil
}
