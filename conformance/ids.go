package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// processEachTwice delivers every message twice and expects Processed then
// Duplicate and exactly one effect each: the messages must be distinct keys.
func processEachTwice(ctx context.Context, env *Env, msgs []inbox.Message) error {
	ib := env.Inbox()
	for _, m := range msgs {
		out, err := ib.Process(ctx, m, env.Apply)
		if err := expectOutcome(fmt.Sprintf("first delivery of %q/%q", m.Consumer, m.ID), out, err, inbox.Processed); err != nil {
			return err
		}
	}
	for _, m := range msgs {
		out, err := ib.Process(ctx, m, env.Apply)
		if err := expectOutcome(fmt.Sprintf("redelivery of %q/%q", m.Consumer, m.ID), out, err, inbox.Duplicate); err != nil {
			return err
		}
		if err := env.expectEffects(ctx, m, 1); err != nil {
			return err
		}
	}
	return nil
}

var scopeChecks = []Check{
	{Area: "scope", Name: "same-id-two-consumers",
		Doc: "one event consumed by two consumers takes effect once in each",
		Run: func(ctx context.Context, env *Env) error {
			a := env.Msg("shared-1")
			b := a
			b.Consumer = "conformance-other"
			return processEachTwice(ctx, env, []inbox.Message{a, b})
		}},
	{Area: "scope", Name: "key-uses-event-day-not-time",
		Doc: "a redelivery carrying another time of the same UTC day is a duplicate; the day is taken in UTC whatever the time zone",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			first := env.MsgOn("sameday-1", 0)
			first.Time = env.Today.Add(30 * time.Second)
			out, err := ib.Process(ctx, first, env.Apply)
			if err := expectOutcome("first delivery", out, err, inbox.Processed); err != nil {
				return err
			}
			later := first
			// The same instant seen from UTC-10 is the previous local day; and
			// a later time of the same UTC day.
			for _, t := range []time.Time{first.Time.In(time.FixedZone("UTC-10", -10*3600)), env.Today.Add(23*time.Hour + 59*time.Minute)} {
				later.Time = t
				out, err := ib.Process(ctx, later, env.Apply)
				if err := expectOutcome("redelivery at "+t.Format(time.RFC3339), out, err, inbox.Duplicate); err != nil {
					return err
				}
			}
			return env.expectEffects(ctx, first, 1)
		}},
	{Area: "scope", Name: "case-and-trailing-spaces-are-distinct",
		Doc: "ids and consumers that differ only in letter case or trailing spaces are different keys (no case-insensitive or PAD SPACE collation)",
		Run: func(ctx context.Context, env *Env) error {
			var msgs []inbox.Message
			for _, id := range []string{"Order-1", "order-1", "ORDER-1", "order-1 ", "order-1  ", " order-1", "order-1\t"} {
				msgs = append(msgs, env.Msg(id))
			}
			for _, c := range []string{"Billing", "billing", "billing "} {
				m := env.Msg("order-1")
				m.Consumer = c
				msgs = append(msgs, m)
			}
			return processEachTwice(ctx, env, msgs)
		}},
}

var idChecks = []Check{
	{Area: "ids", Name: "maximum-length-ids",
		Doc: "ids of the maximum length in bytes (ASCII and multi-byte) are stored whole: ids differing only in their last byte are distinct",
		Run: func(ctx context.Context, env *Env) error {
			ascii := strings.Repeat("x", storage.MaxEventIDBytes-1)
			// 85 three-byte runes: 255 bytes.
			wide := strings.Repeat("界", storage.MaxEventIDBytes/3)
			consumer := strings.Repeat("c", storage.MaxConsumerBytes)
			var msgs []inbox.Message
			for _, id := range []string{ascii + "a", ascii + "b", wide, wide[:len(wide)-3] + "語"} {
				m := env.Msg(id)
				msgs = append(msgs, m)
				m.Consumer = consumer
				msgs = append(msgs, m)
			}
			return processEachTwice(ctx, env, msgs)
		}},
	{Area: "ids", Name: "unicode-ids",
		Doc: "unicode ids are stored byte for byte: composed and decomposed forms, emoji, right-to-left text are distinct keys",
		Run: func(ctx context.Context, env *Env) error {
			var msgs []inbox.Message
			for _, id := range []string{"заказ-1", "注文-1", "🧾-1", "🧾-2", "café", "cafe\u0301", "طلب-١", "ß", "ss", "\u00a0x", " x"} {
				msgs = append(msgs, env.Msg(id))
			}
			return processEachTwice(ctx, env, msgs)
		}},
	{Area: "ids", Name: "sql-metacharacters-in-ids",
		Doc: "ids full of SQL metacharacters are plain data",
		Run: func(ctx context.Context, env *Env) error {
			var msgs []inbox.Message
			for _, id := range []string{`'; DROP TABLE inbox; --`, `"quoted"`, `back\slash\`, `100%_like`, `@named`, `?`, `$1`, "`tick`", `/* c */`, "line\nbreak", `'' OR 1=1`, `\'`} {
				msgs = append(msgs, env.Msg(id))
			}
			m := env.Msg("meta-consumer")
			m.Consumer = `c'; --"@?`
			msgs = append(msgs, m)
			return processEachTwice(ctx, env, msgs)
		}},
	{Area: "ids", Name: "invalid-ids-are-clear-errors",
		Doc: "an over-long, empty, non-UTF-8 or NUL-bearing id, or a message without event time, is a clear error that writes nothing, and an over-long id is never truncated",
		Run: func(ctx context.Context, env *Env) error {
			ib := env.Inbox()
			long := strings.Repeat("y", storage.MaxEventIDBytes)
			tooLong := env.Msg(long + "z")
			noTime := env.Msg("no-time")
			noTime.Time = time.Time{}
			noConsumer := env.Msg("no-consumer")
			noConsumer.Consumer = ""
			for _, m := range []inbox.Message{tooLong, env.Msg(""), env.Msg("bad-\xff-utf8"), env.Msg("nul-\x00-byte"), noTime, noConsumer} {
				ran := false
				out, err := ib.Process(ctx, m, func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
					ran = true
					return nil
				})
				if out != inbox.Failed || !errors.Is(err, inbox.ErrInvalidMessage) {
					return fmt.Errorf("invalid message %q: outcome %v, error %v; want Failed wrapping inbox.ErrInvalidMessage", m.ID, out, err)
				}
				if ran {
					return fmt.Errorf("invalid message %q: handler ran", m.ID)
				}
			}
			if n, err := env.TotalEffects(ctx); err != nil || n != 0 {
				return fmt.Errorf("effects after invalid messages: %d (%v), want 0", n, err)
			}
			// A truncating store would have stored the 255-byte prefix.
			return processEachTwice(ctx, env, []inbox.Message{env.Msg(long)})
		}},
}

// RowOf is the inbox row the inbox claims for m, for adapter tests that
// call a store directly.
func RowOf(m inbox.Message) storage.InboxRow {
	return storage.InboxRow{Consumer: m.Consumer, EventID: m.ID, Day: m.Day(), EventTime: m.Time.UTC(),
		Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}
}
