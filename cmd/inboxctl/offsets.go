package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/storage"
)

// defaultOffsetsTable is consumer.DefaultOffsetsTable (not imported: the
// consumer package would bring its Kafka client into every command).
const defaultOffsetsTable = "inbox_offsets"

var offsetsSpec = cmdSpec{
	name: "offsets",
	synopsis: `Show or reset a consumer group's stored offsets: the table of
consumer Config.Offsets.Store (--table, the consumer's Config.Offsets.Table,
default inbox_offsets), where each partition's next offset is written with
the effect that made it so. A stored offset wins over the group's committed
offset in Kafka, so resetting the group in Kafka alone changes nothing: reset
here. The first argument is the action:

  show   each stored offset of --group (of --topic only, if given): the next
         offset to read, the generation that wrote it and whether it holds
         the fingerprint of the message before it; with --brokers, also the
         group's committed offset in Kafka, the log start and end offsets and
         the lag, and the topic's partitions that have no stored offset yet,
         with a note for a stored offset past the log end (the consumer
         stops that partition) or below the log start; a topic that no
         longer exists is noted on stderr
  reset  set the stored offsets of --topic (every partition, or --partition)
         to --to-offset N, --to-time T (the first message at or after T; the
         log end where there is none), --to-start (the log start) or
         --to-end (the log end); --dry-run prints the plan and changes
         nothing

reset is for a stopped group, like any offset reset: a running member would
overwrite the row with its next write. With --brokers (needed for every
target but --to-offset) it refuses while the group has members, naming them;
without, it cannot tell and warns. It also commits the same offsets to the
group in Kafka, so that the two agree (the consumer warns on assignment when
the group's offset is ahead of the stored one, a sign of lost database
commits, and without Offsets.Store the group's is used). The message before
the new offset is unknown, so the recreated-topic check on assignment is
skipped for the reset rows. A --to-offset past the log end is refused (the
consumer would stop the partition); one below the log start is taken as the
log start by the consumer, with a Warn.

The offsets table lives where the consumer's connection finds it (its search
path or database): --schema is not taken.`,
	examples: `  inboxctl offsets show --dsn "$DSN" --group billing
  inboxctl offsets show --dsn "$DSN" --brokers kafka:9092 --group billing --topic orders --json
  inboxctl offsets reset --dsn "$DSN" --brokers kafka:9092 --group billing --topic orders --to-time 2026-12-01T08:00:00Z --dry-run
  inboxctl offsets reset --dsn "$DSN" --brokers kafka:9092 --group billing --topic orders --partition 3 --to-offset 1200
  inboxctl offsets reset --dsn "$DSN" --group billing --topic orders --partition 3 --to-offset 1200
`,
	timeout: 2 * time.Minute,
}

const offsetsActions = "show or reset"

type offsetsResult struct {
	Dialect string `json:"dialect"`
	Table   string `json:"table"`
	Group   string `json:"group"`
	Action  string `json:"action"`
	DryRun  bool   `json:"dry_run,omitempty"`
	// show: the stored rows (and, with brokers, the partitions without one);
	// reset: each partition's offset before and after.
	Partitions []*partitionOffsets `json:"partitions"`
	// GroupState is the group's state in Kafka (with brokers).
	GroupState string `json:"group_state,omitempty"`
}

type partitionOffsets struct {
	Topic         string `json:"topic"`
	Partition     int32  `json:"partition"`
	Stored        *int64 `json:"stored"` // null: no row
	Generation    int32  `json:"generation,omitempty"`
	Fingerprinted bool   `json:"fingerprinted,omitempty"`
	// With brokers.
	Committed *int64 `json:"committed,omitempty"` // the group's offset in Kafka; null: none
	LogStart  *int64 `json:"log_start,omitempty"`
	LogEnd    *int64 `json:"log_end,omitempty"`
	Lag       *int64 `json:"lag,omitempty"` // log end - stored
	// reset: the new stored offset.
	New *int64 `json:"new,omitempty"`
}

func runOffsets(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const cmd = "offsets"
	action := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		action, args = args[0], args[1:]
	}
	fs, o := newFlagSet(offsetsSpec)
	fs.Lookup("table").Usage = "the offsets `table` (the consumer's Config.Offsets.Table; default " + defaultOffsetsTable + ")"
	fs.Lookup("schema").Usage = "not taken: the offsets table is where the consumer's connection finds it"
	group := fs.String("group", "", "the consumer `group` (the consumer's Config.GroupID); required")
	topic := fs.String("topic", "", "only this `topic`; required for reset")
	var partition partitionFlag
	fs.Var(&partition, "partition", "reset: only this partition `number` (default every partition of the topic)")
	brokers := fs.String("brokers", "", "the Kafka `brokers`, comma-separated (default $"+brokersEnv+"): the log offsets, the group's state and committed offsets")
	toOffset := fs.Int64("to-offset", -1, "reset: to this `offset`")
	var toTime timeFlag
	fs.Var(&toTime, "to-time", "reset: to the first message at or after this `time` (RFC 3339, or a date: its midnight UTC)")
	toStart := fs.Bool("to-start", false, "reset: to the log start")
	toEnd := fs.Bool("to-end", false, "reset: to the log end")
	dryRun := fs.Bool("dry-run", false, "reset: change nothing; print the plan")
	if err := parseFlags(fs, args, stdout); err != nil {
		if err == errHelp {
			return exitOK
		}
		return fail(stderr, cmd, err)
	}
	targets, offsetSet := 0, false
	fs.Visit(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "to-") {
			targets++
		}
		offsetSet = offsetSet || f.Name == "to-offset"
	})
	switch {
	case action == "":
		return fail(stderr, cmd, usageErrorf("missing action: %s", offsetsActions))
	case action != "show" && action != "reset":
		return fail(stderr, cmd, usageErrorf("unknown action %q: want %s", action, offsetsActions))
	case *group == "":
		return fail(stderr, cmd, usageErrorf("--group is required: the consumer group whose stored offsets to %s", action))
	case o.schema != "":
		return fail(stderr, cmd, usageErrorf("--schema is not taken: the offsets table is where the consumer's connection finds it (its search path or database)"))
	case action == "show" && (targets > 0 || *dryRun || partition.set):
		return fail(stderr, cmd, usageErrorf("--to-*, --partition and --dry-run are for reset"))
	case action == "reset" && *topic == "":
		return fail(stderr, cmd, usageErrorf("--topic is required for reset"))
	case action == "reset" && targets != 1:
		return fail(stderr, cmd, usageErrorf("reset takes exactly one of --to-offset, --to-time, --to-start, --to-end"))
	case offsetSet && *toOffset < 0:
		return fail(stderr, cmd, usageErrorf("--to-offset must not be negative, got %d", *toOffset))
	}
	bs := splitBrokers(*brokers, true)
	if action == "reset" && len(bs) == 0 && *toOffset < 0 {
		return fail(stderr, cmd, usageErrorf("--to-time, --to-start and --to-end need the brokers: pass --brokers or set $%s", brokersEnv))
	}
	if err := o.resolve(false); err != nil {
		return fail(stderr, cmd, err)
	}
	if o.table == "" {
		o.table = defaultOffsetsTable
	}
	if err := storage.ValidateIdentifier("offsets table", o.table); err != nil {
		return fail(stderr, cmd, usageErrorf("%v", err))
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	b, err := lookupBackend(o.dialect)
	if err != nil {
		return fail(stderr, cmd, err)
	}
	if b.mustExist != nil {
		if err := b.mustExist(o.dsn); err != nil {
			return fail(stderr, cmd, err)
		}
	}
	db, err := openDB(ctx, b, o.dsn)
	if err != nil {
		return fail(stderr, cmd, err)
	}
	defer closeDB(db)
	if !db.Migrator().HasTable(o.table) {
		return fail(stderr, cmd, fmt.Errorf("no offsets table %s in this database: is --table the consumer's Config.Offsets.Table, and did it call Consumer.Migrate with Offsets.Store?", o.table))
	}
	is, err := b.newStore(b.defaultTable, "")
	if err != nil {
		return fail(stderr, cmd, err)
	}
	store, ok := is.(storage.OffsetStore)
	if !ok {
		return fail(stderr, cmd, fmt.Errorf("the %s adapter's store (%T) does not implement storage.OffsetStore", b.name, is))
	}
	rows, err := store.Offsets(ctx, db, o.table, *group, *topic, -1)
	if err != nil {
		return fail(stderr, cmd, err)
	}
	res := offsetsResult{Dialect: b.name, Table: o.table, Group: *group, Action: action, DryRun: *dryRun, Partitions: []*partitionOffsets{}}
	byKey := map[string]*partitionOffsets{}
	key := func(t string, p int32) string { return t + "\x00" + strconv.Itoa(int(p)) }
	add := func(po partitionOffsets) *partitionOffsets {
		res.Partitions = append(res.Partitions, &po)
		return &po
	}
	for _, r := range rows {
		add(partitionOffsets{Topic: r.Topic, Partition: r.Partition, Stored: ptr(r.Next), Generation: r.Generation, Fingerprinted: r.Last != 0})
	}

	var k *kafkaClient
	bounds := map[string]map[int]logBounds{}
	if len(bs) > 0 {
		k = newKafkaClient(bs)
		topics := []string{}
		if *topic != "" {
			topics = append(topics, *topic)
		}
		for _, r := range rows {
			if !slices.Contains(topics, r.Topic) {
				topics = append(topics, r.Topic)
			}
		}
		committed := map[string][]int{}
		for _, t := range topics {
			parts, err := k.partitions(ctx, t)
			if err != nil && action == "show" && t != *topic && errors.Is(err, errNoTopic) {
				// A row of a deleted topic: shown, without the log's columns.
				fmt.Fprintf(stderr, "inboxctl offsets: %v: its stored offsets are shown without the log's\n", err)
				continue
			}
			if err != nil {
				return fail(stderr, cmd, err)
			}
			if bounds[t], err = k.bounds(ctx, t, parts); err != nil {
				return fail(stderr, cmd, err)
			}
			committed[t] = parts
		}
		for _, t := range topics {
			for _, p := range committed[t] {
				if !slices.ContainsFunc(rows, func(r storage.OffsetRow) bool { return r.Topic == t && int(r.Partition) == p }) {
					add(partitionOffsets{Topic: t, Partition: int32(p)})
				}
			}
		}
		slices.SortFunc(res.Partitions, func(a, b *partitionOffsets) int {
			if c := strings.Compare(a.Topic, b.Topic); c != 0 {
				return c
			}
			return int(a.Partition) - int(b.Partition)
		})
		for _, po := range res.Partitions {
			byKey[key(po.Topic, po.Partition)] = po
			if lb, ok := bounds[po.Topic][int(po.Partition)]; ok {
				po.LogStart, po.LogEnd = ptr(lb.start), ptr(lb.end)
				if po.Stored != nil {
					po.Lag = ptr(lb.end - *po.Stored)
				}
			}
		}
		if len(topics) > 0 {
			fr, err := k.c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: *group, Topics: committed})
			if err != nil {
				return fail(stderr, cmd, fmt.Errorf("read the committed offsets of group %s: %w", *group, err))
			}
			if fr.Error != nil {
				return fail(stderr, cmd, fmt.Errorf("read the committed offsets of group %s: %w", *group, fr.Error))
			}
			for t, ps := range fr.Topics {
				for _, p := range ps {
					if po := byKey[key(t, int32(p.Partition))]; po != nil && p.Error == nil && p.CommittedOffset >= 0 {
						po.Committed = ptr(p.CommittedOffset)
					}
				}
			}
		}
		state, members, err := k.groupMembers(ctx, *group)
		if err != nil {
			return fail(stderr, cmd, err)
		}
		res.GroupState = state
		if action == "reset" && len(members) > 0 {
			return fail(stderr, cmd, fmt.Errorf("group %s has %d member(s) (%s), state %s: stop its consumers first, then reset (a running member would overwrite the stored offsets)",
				*group, len(members), strings.Join(members, ", "), state))
		}
	} else {
		for _, po := range res.Partitions {
			byKey[key(po.Topic, po.Partition)] = po
		}
	}

	if action == "show" {
		if len(res.Partitions) == 0 {
			where := ""
			if *topic != "" {
				where = " of topic " + *topic
			}
			return fail(stderr, cmd, fmt.Errorf("group %s has no stored offset%s in %s (is --group the consumer's GroupID, and does it run with Offsets.Store?)", *group, where, o.table))
		}
		if o.json {
			return writeJSON(stdout, stderr, cmd, res)
		}
		printOffsets(stdout, res, k != nil)
		return exitOK
	}

	// reset: the partitions, and their new offsets.
	var parts []int32
	if lb := bounds[*topic]; lb != nil {
		for p := range lb {
			parts = append(parts, int32(p))
		}
	} else {
		for _, r := range rows {
			parts = append(parts, r.Partition)
		}
	}
	if partition.set {
		if len(bs) > 0 && !slices.Contains(parts, partition.n) {
			return fail(stderr, cmd, usageErrorf("topic %s has no partition %d (it has %d)", *topic, partition.n, len(parts)))
		}
		parts = []int32{partition.n}
	}
	if len(parts) == 0 {
		return fail(stderr, cmd, usageErrorf("group %s has no stored offset of topic %s: name the partition (--partition), or pass --brokers to reset every partition of the topic", *group, *topic))
	}
	slices.Sort(parts)
	next := map[int32]int64{}
	var atTime map[int]int64
	if !toTime.t.IsZero() {
		ps := make([]int, len(parts))
		for i, p := range parts {
			ps[i] = int(p)
		}
		if atTime, err = k.offsetsForTime(ctx, *topic, ps, toTime.t, bounds[*topic]); err != nil {
			return fail(stderr, cmd, err)
		}
	}
	for _, p := range parts {
		lb, haveBounds := bounds[*topic][int(p)]
		switch {
		case *toOffset >= 0:
			if haveBounds && *toOffset > lb.end {
				return fail(stderr, cmd, fmt.Errorf("--to-offset %d is past the log end %d of %s/%d: the consumer would stop the partition (ReasonOffsetBeyondLogEnd)", *toOffset, lb.end, *topic, p))
			}
			if haveBounds && *toOffset < lb.start {
				fmt.Fprintf(stderr, "inboxctl offsets: %s/%d: --to-offset %d is below the log start %d: the consumer will start at %d (the messages below are gone), with a Warn\n", *topic, p, *toOffset, lb.start, lb.start)
			}
			next[p] = *toOffset
		case *toStart:
			next[p] = lb.start
		case *toEnd:
			next[p] = lb.end
		default:
			next[p] = atTime[int(p)]
		}
		po := byKey[key(*topic, p)]
		if po == nil {
			po = add(partitionOffsets{Topic: *topic, Partition: p})
			byKey[key(*topic, p)] = po
		}
		po.New = ptr(next[p])
	}
	// Only the partitions reset, in order.
	res.Partitions = slices.DeleteFunc(res.Partitions, func(po *partitionOffsets) bool { return po.New == nil })
	slices.SortFunc(res.Partitions, func(a, b *partitionOffsets) int { return int(a.Partition) - int(b.Partition) })
	if k == nil {
		fmt.Fprintf(stderr, "inboxctl offsets: warning: without --brokers the group's members cannot be checked: make sure every consumer of group %s is stopped (a running member would overwrite the stored offsets), and reset the group's offsets in Kafka to the same values (kafka-consumer-groups.sh --reset-offsets) so that they agree\n", *group)
	}
	if !*dryRun {
		if err := store.ResetOffsets(ctx, db, o.table, *group, *topic, next); err != nil {
			return fail(stderr, cmd, err)
		}
		if k != nil {
			if err := commitGroupOffsets(ctx, k, *group, *topic, next); err != nil {
				return fail(stderr, cmd, fmt.Errorf("the stored offsets were reset, but committing them to the group in Kafka failed (the stored ones win; reset the group's with kafka-consumer-groups.sh --reset-offsets to agree): %w", err))
			}
		}
	}
	if o.json {
		return writeJSON(stdout, stderr, cmd, res)
	}
	printOffsets(stdout, res, k != nil)
	return exitOK
}

// commitGroupOffsets commits next to the group in Kafka, as a client
// outside the group (generation -1), which the coordinator accepts only
// while the group has no members.
func commitGroupOffsets(ctx context.Context, k *kafkaClient, group, topic string, next map[int32]int64) error {
	var cs []kafka.OffsetCommit
	for _, p := range slices.Sorted(maps.Keys(next)) {
		cs = append(cs, kafka.OffsetCommit{Partition: int(p), Offset: next[p]})
	}
	res, err := k.c.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1, Topics: map[string][]kafka.OffsetCommit{topic: cs}})
	if err != nil {
		return err
	}
	var errs []error
	for t, ps := range res.Topics {
		for _, p := range ps {
			if p.Error != nil {
				errs = append(errs, fmt.Errorf("%s/%d: %w", t, p.Partition, p.Error))
			}
		}
	}
	return errors.Join(errs...)
}

func printOffsets(w io.Writer, res offsetsResult, withKafka bool) {
	title := fmt.Sprintf("%s offsets table %s, group %s", res.Dialect, res.Table, cell(res.Group))
	if res.GroupState != "" {
		title += " (Kafka state " + res.GroupState + ")"
	}
	switch {
	case res.Action == "reset" && res.DryRun:
		title += ": reset plan (dry run, nothing changed)"
	case res.Action == "reset":
		title += ": reset"
	}
	fmt.Fprintln(w, title)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	cols := "TOPIC\tPARTITION\tSTORED\tGENERATION\tFINGERPRINT"
	if withKafka {
		cols += "\tCOMMITTED\tLOG START\tLOG END\tLAG"
	}
	if res.Action == "reset" {
		cols += "\tNEW"
	}
	fmt.Fprintln(tw, cols)
	opt := func(p *int64) string {
		if p == nil {
			return "-"
		}
		return strconv.FormatInt(*p, 10)
	}
	for _, po := range res.Partitions {
		fp := "no"
		if po.Fingerprinted {
			fp = "yes"
		}
		gen := strconv.Itoa(int(po.Generation))
		if po.Stored == nil {
			fp, gen = "-", "-"
		}
		line := fmt.Sprintf("%s\t%d\t%s\t%s\t%s", cell(po.Topic), po.Partition, opt(po.Stored), gen, fp)
		if withKafka {
			line += fmt.Sprintf("\t%s\t%s\t%s\t%s", opt(po.Committed), opt(po.LogStart), opt(po.LogEnd), opt(po.Lag))
		}
		if res.Action == "reset" {
			line += "\t" + opt(po.New)
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	for _, po := range res.Partitions {
		switch {
		case po.Stored == nil || po.LogEnd == nil:
		case *po.Stored > *po.LogEnd:
			fmt.Fprintf(w, "%s/%d: the stored offset %d is past the log end %d (was the topic recreated?): the consumer stops the partition until it is reset (offsets reset --to-start)\n",
				cell(po.Topic), po.Partition, *po.Stored, *po.LogEnd)
		case *po.Stored < *po.LogStart:
			fmt.Fprintf(w, "%s/%d: the stored offset %d is below the log start %d: the consumer starts at the log start, %d message(s) it never processed are gone\n",
				cell(po.Topic), po.Partition, *po.Stored, *po.LogStart, *po.LogStart-*po.Stored)
		}
	}
}

func ptr[T any](v T) *T { return &v }
