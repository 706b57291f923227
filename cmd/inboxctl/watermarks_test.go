package main

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gorm.io/gorm"

	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/internal/watermark"
	"github.com/inboxgo/inbox/storage"
)

// seedWatermarks writes streams of consumer billing, and one of shipping
// that billing's listing must not show, through the store's
// SaveWatermarks, as a consumer does: inserts in one transaction, then a
// compare-and-set that moves one stream on.
func seedWatermarks(t *testing.T, db *gorm.DB, store storage.InboxStore) {
	t.Helper()
	ws, ok := store.(storage.WatermarkStore)
	if !ok {
		t.Fatalf("%T does not implement storage.WatermarkStore", store)
	}
	key := func(scope, topic string, partition int32, source string, epoch int64) storage.WatermarkKey {
		return storage.WatermarkKey{Scope: scope, Topic: topic, Partition: partition, Source: source, Epoch: epoch}
	}
	first := watermark.Encode(watermark.Applied{0: 120, 1: 350, 2: 300})
	writes := []storage.WatermarkWrite{
		{WatermarkKey: key("billing", "orders", 0, "src-a", 1), New: first},
		{WatermarkKey: key("billing", "orders", 0, "src-a", 2), New: watermark.Encode(watermark.Applied{5: 7})},
		{WatermarkKey: key("billing", "orders", 1, "src-b", 1), New: watermark.Encode(watermark.Applied{0: 1})},
		{WatermarkKey: key("billing", "audit", 2, "src-a", 1), New: watermark.Encode(watermark.Applied{3: 9})},
		{WatermarkKey: key("shipping", "orders", 0, "src-a", 1), New: watermark.Encode(watermark.Applied{0: 99})},
	}
	slices.SortFunc(writes, func(a, b storage.WatermarkWrite) int { return a.Compare(b.WatermarkKey) })
	save := func(writes ...storage.WatermarkWrite) {
		t.Helper()
		if err := db.Transaction(func(tx *gorm.DB) error { return ws.SaveWatermarks(t.Context(), tx, writes) }); err != nil {
			t.Fatalf("SaveWatermarks: %v", err)
		}
	}
	save(writes...)
	save(storage.WatermarkWrite{WatermarkKey: key("billing", "orders", 0, "src-a", 1), Old: first,
		New: watermark.Encode(watermark.Applied{0: 120, 1: 409, 2: 300})})
}

// spaces collapses the runs of blanks that align the table's columns.
var spaces = regexp.MustCompile(`[ \t]+`)

// expectWatermarks drives migrate and watermarks with the connection flags
// common (which name the inbox table) on db, whose store is the inbox
// table's and rawTable its watermark table as SQL names it: migrate makes
// the table, the seeded streams are listed (text, -v, --json, filtered),
// and a value that does not decode, written with raw SQL, is reported
// naming its stream with exit status 1, the other streams still listed.
func expectWatermarks(t *testing.T, db *gorm.DB, store storage.InboxStore, rawTable string, common ...string) {
	t.Helper()
	args := func(cmd string, extra ...string) []string {
		return append(append([]string{cmd}, common...), extra...)
	}
	m := decodeJSON[migrateResult](t, runArgs(t, args("migrate", "--json")...))
	if !m.OK || m.WatermarkTable != m.Table+"_watermarks" || m.WatermarkError != "" {
		t.Fatalf("migrate --json: %+v, want the watermark table made", m)
	}
	r := runArgs(t, args("watermarks", "--consumer", "billing")...)
	expectCode(t, r, exitFailed)
	if !strings.Contains(r.stderr, "no stream of consumer billing exists in ") || strings.Contains(r.stderr, "consumers with streams") || r.stdout != "" {
		t.Errorf("watermarks before any was written:\n%v", r)
	}
	r = runArgs(t, args("stats")...)
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "_watermarks (sequenced dedup, no inbox rows): no streams\n") {
		t.Errorf("stats before any watermark was written:\n%v", r)
	}

	seedWatermarks(t, db, store)

	// A mistyped consumer, or filters that leave none of its streams.
	r = runArgs(t, args("watermarks", "--consumer", "bilingg")...)
	expectCode(t, r, exitFailed)
	if !strings.Contains(r.stderr, "no stream of consumer bilingg exists in ") || !strings.Contains(r.stderr, "consumers with streams: billing, shipping\n") || r.stdout != "" {
		t.Errorf("watermarks of a mistyped consumer:\n%v", r)
	}
	r = runArgs(t, args("watermarks", "--consumer", "billing", "--topic", "orders", "--partition", "7", "--json")...)
	expectCode(t, r, exitFailed)
	if !strings.Contains(r.stderr, "consumer billing has 4 stream(s) in ") || !strings.Contains(r.stderr, ", none on topic orders on partition 7\n") || r.stdout != "" {
		t.Errorf("watermarks filtered to nothing:\n%v", r)
	}

	// stats shows the consumers that deduplicate by watermark.
	r = runArgs(t, args("stats")...)
	expectCode(t, r, exitOK)
	text := spaces.ReplaceAllString(r.stdout, " ")
	if !strings.Contains(text, "(sequenced dedup, no inbox rows): 2 consumer(s)\nCONSUMER STREAMS SOURCES \nbilling 4 2 \nshipping 1 1 \n") {
		t.Errorf("stats lacks the watermark consumers:\n%v", r)
	}
	st := decodeJSON[statsResult](t, runArgs(t, args("stats", "--json")...))
	if st.WatermarkTable != m.Table+"_watermarks" || !slices.Equal(st.WatermarkConsumers, []watermarkConsumer{{"billing", 4, 2}, {"shipping", 1, 1}}) {
		t.Errorf("stats --json: watermark table %q, consumers %+v", st.WatermarkTable, st.WatermarkConsumers)
	}

	r = runArgs(t, args("watermarks", "--consumer", "billing")...)
	expectCode(t, r, exitOK)
	text = spaces.ReplaceAllString(r.stdout, " ")
	want := []string{
		"TOPIC PARTITION SOURCE EPOCH APPLIED\n",
		"audit 2 src-a 1 shards 1, min 9, max 9\n",
		"orders 0 src-a 1 shards 3, min 120, max 409\n",
		"orders 0 src-a 2 shards 1, min 7, max 7\n",
		"orders 1 src-b 1 shards 1, min 1, max 1\n",
	}
	last := -1
	for _, w := range want {
		i := strings.Index(text, w)
		if i < 0 {
			t.Errorf("watermarks lacks %q:\n%v", w, r)
		} else if i < last {
			t.Errorf("watermarks: %q is out of order:\n%v", w, r)
		}
		last = i
	}
	// The rows only: the heading names the table, whose random suffix may hold "99".
	rows := text[max(strings.Index(text, "TOPIC"), 0):]
	if !strings.Contains(text, "consumer billing: 4 stream(s)\n") || strings.Contains(rows, "99") || strings.Contains(rows, "0:120") || r.stderr != "" {
		t.Errorf("watermarks:\n%v", r)
	}

	r = runArgs(t, args("watermarks", "--consumer", "billing", "-v")...)
	expectCode(t, r, exitOK)
	t.Logf("watermarks -v:\n%s", r.stdout)
	text = spaces.ReplaceAllString(r.stdout, " ")
	for _, w := range []string{"orders 0 src-a 1 shards 3, min 120, max 409\n 0:120 1:409 2:300\n", "orders 0 src-a 2 shards 1, min 7, max 7\n 5:7\n"} {
		if !strings.Contains(text, w) {
			t.Errorf("watermarks -v lacks %q:\n%v", w, r)
		}
	}

	res := decodeJSON[watermarksResult](t, runArgs(t, args("watermarks", "--consumer", "billing", "--json")...))
	if res.Consumer != "billing" || res.Table != m.Table+"_watermarks" || res.Unreadable != 0 || res.Partition != nil || len(res.Streams) != 4 {
		t.Fatalf("watermarks --json: %+v", res)
	}
	var got []string
	for _, s := range res.Streams {
		got = append(got, fmt.Sprintf("%s %d %s %d", s.Topic, s.Partition, s.Source, s.Epoch))
	}
	if strings.Join(got, ", ") != "audit 2 src-a 1, orders 0 src-a 1, orders 0 src-a 2, orders 1 src-b 1" {
		t.Errorf("watermarks --json streams in the order %v", got)
	}
	if s := res.Streams[1]; s.Shards != 3 || s.Min != 120 || s.Max != 409 || s.Error != "" ||
		!slices.Equal(s.Applied, []shardSeq{{0, 120}, {1, 409}, {2, 300}}) {
		t.Errorf("watermarks --json orders[0] src-a epoch 1: %+v", s)
	}

	res = decodeJSON[watermarksResult](t, runArgs(t, args("watermarks", "--consumer", "billing", "--topic", "orders", "--partition", "0", "--json")...))
	if len(res.Streams) != 2 || res.Streams[0].Epoch != 1 || res.Streams[1].Epoch != 2 || res.Topic != "orders" || res.Partition == nil || *res.Partition != 0 {
		t.Errorf("watermarks --topic orders --partition 0 --json: %+v", res)
	}
	r = runArgs(t, args("watermarks", "--consumer", "billing", "--partition", "1")...)
	expectCode(t, r, exitOK)
	if text := spaces.ReplaceAllString(r.stdout, " "); !strings.Contains(text, "partition 1: 1 stream(s)") || !strings.Contains(text, "orders 1 src-b 1 shards 1") {
		t.Errorf("watermarks --partition 1:\n%v", r)
	}
	res = decodeJSON[watermarksResult](t, runArgs(t, args("watermarks", "--consumer", "shipping", "--json")...))
	if len(res.Streams) != 1 || res.Streams[0].Max != 99 {
		t.Errorf("watermarks --consumer shipping --json: %+v", res)
	}

	// A truncated value: a shard with no sequence number.
	if err := db.Exec("UPDATE "+rawTable+" SET applied = ? WHERE scope = ? AND topic = ? AND partition_no = ?",
		[]byte{0x01}, "billing", "orders", 1).Error; err != nil {
		t.Fatal(err)
	}
	const bad = "stream topic orders partition 1, source src-b epoch 1: the stored value does not decode: watermark: bad sequence number in the stored value (1 bytes: 01)"
	r = runArgs(t, args("watermarks", "--consumer", "billing")...)
	expectCode(t, r, exitFailed)
	t.Logf("watermarks with a bad value:\n%v", r)
	text = spaces.ReplaceAllString(r.stdout, " ")
	if r.stderr != "inboxctl watermarks: "+bad+"\n" {
		t.Errorf("watermarks of a bad value: stderr does not name the stream:\n%v", r)
	}
	for _, w := range []string{"4 stream(s)", "orders 1 src-b 1 UNREADABLE: watermark: bad sequence number", "orders 0 src-a 2 shards 1, min 7, max 7", "1 stream(s) with a stored value that does not decode"} {
		if !strings.Contains(text, w) {
			t.Errorf("watermarks of a bad value lacks %q:\n%v", w, r)
		}
	}
	r = runArgs(t, args("watermarks", "--consumer", "billing", "--json")...)
	expectCode(t, r, exitFailed)
	res = decodeJSON[watermarksResult](t, r)
	if res.Unreadable != 1 || len(res.Streams) != 4 {
		t.Fatalf("watermarks --json of a bad value: %+v", res)
	}
	if s := res.Streams[3]; s.Topic != "orders" || s.Partition != 1 || s.Stored != "01" || s.Applied != nil ||
		!strings.Contains(s.Error, "bad sequence number") || !strings.Contains(r.stderr, bad) {
		t.Errorf("watermarks --json of a bad value: %+v\n%v", s, r)
	}
	if !strings.Contains(r.stdout, `"applied": null`) {
		t.Errorf("watermarks --json: an unreadable value's applied is not null:\n%s", r.stdout)
	}
}

func TestSQLiteWatermarks(t *testing.T) {
	dsn := inboxsqlite.DSN(sqliteFile(t))
	const table = "orders_inbox"
	store, err := inboxsqlite.New(inboxsqlite.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	expectCode(t, runArgs(t, "migrate", "--dsn", dsn, "--table", table), exitOK) // creates the file
	expectWatermarks(t, openGorm(t, dialectSQLite, dsn), store, table+"_watermarks", "--dsn", dsn, "--table", table)
}

// TestSQLiteWatermarksTable: a watermark table that is missing, or that an
// inbox table's long name leaves no room for, is reported as such.
func TestSQLiteWatermarksTable(t *testing.T) {
	dsn := inboxsqlite.DSN(sqliteFile(t))
	r := runArgs(t, "migrate", "--dsn", dsn)
	expectCode(t, r, exitOK)
	if r.stdout != "migrated sqlite table inbox_messages\nmigrated sqlite watermark table inbox_messages_watermarks\n" {
		t.Errorf("migrate:\n%v", r)
	}
	if err := openGorm(t, dialectSQLite, dsn).Exec("DROP TABLE inbox_messages_watermarks").Error; err != nil {
		t.Fatal(err)
	}
	r = runArgs(t, "watermarks", "--dsn", dsn, "--consumer", "billing")
	expectCode(t, r, exitFailed)
	if !strings.Contains(r.stderr, "watermark table inbox_messages_watermarks does not exist: inboxctl migrate") {
		t.Errorf("watermarks without the table:\n%v", r)
	}

	// 60 bytes: a valid inbox table, but no room for _watermarks.
	long := "inbox_" + strings.Repeat("x", 54)
	r = runArgs(t, "migrate", "--dsn", dsn, "--table", long, "--json")
	expectCode(t, r, exitOK)
	if m := decodeJSON[migrateResult](t, r); !m.OK || m.WatermarkTable != "" || !strings.Contains(m.WatermarkError, "has no watermark table") {
		t.Errorf("migrate --json of a long table name: %+v", m)
	}
	if !strings.Contains(r.stderr, "warning:") || !strings.Contains(r.stderr, "cannot use sequenced dedup") {
		t.Errorf("migrate of a long table name does not warn:\n%v", r)
	}
	r = runArgs(t, "watermarks", "--dsn", dsn, "--table", long, "--consumer", "billing")
	expectCode(t, r, exitUsage)
	if !strings.Contains(r.stderr, "has no watermark table") {
		t.Errorf("watermarks of a long table name:\n%v", r)
	}
	r = runArgs(t, "migrate", "--print-sql", "--dialect", "sqlite", "--table", long)
	expectCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "-- Not included: no watermark table") || !strings.Contains(r.stderr, "too long for "+long+"_watermarks") {
		t.Errorf("migrate --print-sql of a long table name:\n%v", r)
	}
}

// TestMigratePrintSQLHasWatermarks: the printed DDL makes the watermark
// table, after the inbox table, on every dialect, and has no note of
// anything left out.
func TestMigratePrintSQLHasWatermarks(t *testing.T) {
	for dialect, table := range map[string]string{dialectSQLite: "inbox_messages_watermarks", dialectPostgres: `"app"."inbox_messages_watermarks"`, dialectMySQL: "`app`.`inbox_messages_watermarks`"} {
		args := []string{"migrate", "--print-sql", "--dialect", dialect}
		if dialect != dialectSQLite {
			args = append(args, "--schema", "app")
		}
		r := runArgs(t, args...)
		expectCode(t, r, exitOK)
		wm := strings.Index(r.stdout, "CREATE TABLE IF NOT EXISTS "+table+" (")
		if wm < 0 || wm < strings.Index(r.stdout, "CREATE TABLE") || strings.Contains(r.stdout, "Not included") || r.stderr != "" {
			t.Errorf("%s: the DDL does not make the watermark table %s after the inbox table, or notes something left out:\n%v", dialect, table, r)
		}
	}
}
