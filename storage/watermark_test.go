package storage_test

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"

	"github.com/inboxgo/inbox/storage"
)

var wmKey = storage.WatermarkKey{Scope: "billing", Source: "orders-db", Epoch: 1, Topic: "orders", Partition: 0}

// with is wmKey changed by change.
func with(change func(*storage.WatermarkKey)) storage.WatermarkKey {
	k := wmKey
	change(&k)
	return k
}

func write(k storage.WatermarkKey, old, new string) storage.WatermarkWrite {
	w := storage.WatermarkWrite{WatermarkKey: k}
	if old != "\x00nil" {
		w.Old = []byte(old)
	}
	if new != "\x00nil" {
		w.New = []byte(new)
	}
	return w
}

const none = "\x00nil" // no value: a nil slice

func TestCheckWatermarkWrites(t *testing.T) {
	later := with(func(k *storage.WatermarkKey) { k.Partition = 1 })
	cases := []struct {
		name   string
		writes []storage.WatermarkWrite
		// The words the error must hold; "" for no error.
		want string
	}{
		{"no writes", nil, ""},
		{"an insert", []storage.WatermarkWrite{write(wmKey, none, "v")}, ""},
		{"an update to the empty value", []storage.WatermarkWrite{write(wmKey, "v", "")}, ""},
		{"sorted keys", []storage.WatermarkWrite{write(wmKey, none, "v"), write(later, "a", "b")}, ""},
		{"the longest names and value", []storage.WatermarkWrite{write(storage.WatermarkKey{
			Scope: strings.Repeat("s", storage.MaxConsumerBytes), Source: strings.Repeat("r", storage.MaxSourceBytes),
			Epoch: 1, Topic: strings.Repeat("t", storage.MaxTopicBytes), Partition: 1 << 30,
		}, none, strings.Repeat("v", storage.MaxWatermarkBytes))}, ""},

		{"an empty scope", []storage.WatermarkWrite{write(with(func(k *storage.WatermarkKey) { k.Scope = "" }), none, "v")}, "watermark scope of 0 bytes"},
		{"a scope over MaxConsumerBytes", []storage.WatermarkWrite{write(with(func(k *storage.WatermarkKey) { k.Scope = strings.Repeat("s", storage.MaxConsumerBytes+1) }), none, "v")}, "watermark scope of 129 bytes (1..128 allowed)"},
		{"an empty source", []storage.WatermarkWrite{write(with(func(k *storage.WatermarkKey) { k.Source = "" }), none, "v")}, "watermark source of 0 bytes"},
		{"a source over MaxSourceBytes", []storage.WatermarkWrite{write(with(func(k *storage.WatermarkKey) { k.Source = strings.Repeat("r", storage.MaxSourceBytes+1) }), none, "v")}, "watermark source of"},
		{"an empty topic", []storage.WatermarkWrite{write(with(func(k *storage.WatermarkKey) { k.Topic = "" }), none, "v")}, "watermark topic of 0 bytes"},
		{"a topic over MaxTopicBytes", []storage.WatermarkWrite{write(with(func(k *storage.WatermarkKey) { k.Topic = strings.Repeat("t", storage.MaxTopicBytes+1) }), none, "v")}, "watermark topic of"},
		{"NUL in the scope", []storage.WatermarkWrite{write(with(func(k *storage.WatermarkKey) { k.Scope = "bill\x00ing" }), none, "v")}, "not UTF-8 without NUL bytes"},
		{"invalid UTF-8 in the topic", []storage.WatermarkWrite{write(with(func(k *storage.WatermarkKey) { k.Topic = "orders\xff" }), none, "v")}, "not UTF-8 without NUL bytes"},
		{"epoch 0", []storage.WatermarkWrite{write(with(func(k *storage.WatermarkKey) { k.Epoch = 0 }), none, "v")}, "epoch below 1"},
		{"a negative partition", []storage.WatermarkWrite{write(with(func(k *storage.WatermarkKey) { k.Partition = -1 }), none, "v")}, "negative partition"},
		{"no new value", []storage.WatermarkWrite{write(wmKey, none, none)}, "has no new value"},
		{"a value over MaxWatermarkBytes", []storage.WatermarkWrite{write(wmKey, none, strings.Repeat("v", storage.MaxWatermarkBytes+1))}, "a value of 65536 bytes, at most 65535 allowed"},
		{"a new value equal to the old one", []storage.WatermarkWrite{write(wmKey, "v", "v")}, "the new value equals the old one"},
		{"keys out of order", []storage.WatermarkWrite{write(later, none, "v"), write(wmKey, none, "v")}, "write 1 (stream \"billing\"/\"orders\"[0] of source \"orders-db\" epoch 1): keys not distinct and sorted"},
		{"a key twice", []storage.WatermarkWrite{write(wmKey, none, "v"), write(wmKey, "v", "w")}, "keys not distinct and sorted"},
		{"a bad write after good ones", []storage.WatermarkWrite{write(wmKey, none, "v"), write(later, none, none)}, "write 1 "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := storage.CheckWatermarkWrites(c.writes)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want == "":
			case !errors.Is(err, storage.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want):
				t.Fatalf("got %v, want an error wrapping storage.ErrInvalidConfig that says %q", err, c.want)
			}
		})
	}
}

func TestCheckWatermarkFilter(t *testing.T) {
	for _, c := range []struct {
		scope, topic string
		ok           bool
	}{
		{"billing", "", true},
		{"billing", "orders", true},
		{strings.Repeat("s", storage.MaxConsumerBytes), strings.Repeat("t", storage.MaxTopicBytes), true},
		{"", "", false},
		{"", "orders", false},
		{strings.Repeat("s", storage.MaxConsumerBytes+1), "", false},
		{"billing", strings.Repeat("t", storage.MaxTopicBytes+1), false},
		{"bill\x00ing", "", false},
		{"billing", "\xffoo", false},
	} {
		err := storage.CheckWatermarkFilter(c.scope, c.topic)
		if c.ok && err != nil {
			t.Errorf("scope %q, topic %q: %v, want it allowed", c.scope, c.topic, err)
		}
		if !c.ok && !errors.Is(err, storage.ErrInvalidConfig) {
			t.Errorf("scope %q, topic %q: %v, want an error wrapping storage.ErrInvalidConfig", c.scope, c.topic, err)
		}
	}
}

// countless is a result whose row count the driver cannot tell.
type countless struct{}

func (countless) LastInsertId() (int64, error) { return 0, errors.New("no id") }
func (countless) RowsAffected() (int64, error) { return 0, errors.New("no count") }

func TestCheckWatermarkSaved(t *testing.T) {
	insert, update := write(wmKey, none, "v"), write(wmKey, "v", "w")
	failed := errors.New("connection reset")
	cases := []struct {
		name    string
		w       storage.WatermarkWrite
		res     sql.Result
		execErr error
		moved   bool
		want    string // "" for no error
	}{
		{"an insert of one row", insert, driver.RowsAffected(1), nil, false, ""},
		{"an update of one row", update, driver.RowsAffected(1), nil, false, ""},
		{"an insert of no row", insert, driver.RowsAffected(0), nil, true, `stream "billing"/"orders"[0] of source "orders-db" epoch 1 already has a row`},
		{"an update of no row", update, driver.RowsAffected(0), nil, true, "does not hold the value read"},
		{"two rows", update, driver.RowsAffected(2), nil, false, "2 rows affected, want 1"},
		{"a failed statement", update, nil, failed, false, `stream "billing"/"orders"[0] of source "orders-db" epoch 1: connection reset`},
		{"no count", update, countless{}, nil, false, "rows affected: no count"},
		{"no result", update, nil, nil, false, "no result"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := storage.CheckWatermarkSaved(c.w, c.res, c.execErr)
			if c.want == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error that says %q", err, c.want)
			}
			if errors.Is(err, storage.ErrWatermarkMoved) != c.moved {
				t.Fatalf("%v: wraps ErrWatermarkMoved %v, want %v", err, !c.moved, c.moved)
			}
			if c.execErr != nil && !errors.Is(err, c.execErr) {
				t.Fatalf("%v does not wrap the statement's error", err)
			}
		})
	}
}
