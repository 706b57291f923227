// Package short bounds the values a message brings (its event id, its
// key, a header) wherever the library shows them, in error texts and in
// logs: a 10,000-byte event id must not make a 10,000-byte line.
package short

import (
	"context"
	"log/slog"
	"unicode/utf8"
)

// Max is how many bytes of a value are shown; a longer one is cut there
// (at a character boundary) and followed by "...".
const Max = 64

// String returns v as it is shown: whole up to Max bytes, else its first
// Max bytes (fewer, so as not to split a UTF-8 character) and "...".
func String[T string | []byte](v T) string {
	if len(v) <= Max {
		return string(v)
	}
	n := Max
	for n > Max-utf8.UTFMax && n > 0 && !utf8.RuneStart(v[n]) {
		n--
	}
	return string(v[:n]) + "..."
}

// keys are the log attributes whose values come from a message, which
// Logger shortens.
var keys = map[string]bool{
	"consumer": true, // an inbox Message's, given with each message
	"event_id": true,
	"key":      true,
	"source":   true,
}

// Logger returns l with the string values of the attributes that carry a message's values (event_id, consumer, key, source)
// shortened by String, in its records and in the attributes of its With.
func Logger(l *slog.Logger) *slog.Logger {
	if _, ok := l.Handler().(handler); ok {
		return l
	}
	return slog.New(handler{l.Handler()})
}

type handler struct{ h slog.Handler }

func (h handler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.h.Enabled(ctx, level)
}

func (h handler) Handle(ctx context.Context, r slog.Record) error {
	long := false
	r.Attrs(func(a slog.Attr) bool {
		long = tooLong(a)
		return !long
	})
	if !long {
		return h.h.Handle(ctx, r)
	}
	// Rare: a record of its own, with the attributes shortened.
	nr := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		nr.AddAttrs(bound(a))
		return true
	})
	return h.h.Handle(ctx, nr)
}

func (h handler) WithAttrs(as []slog.Attr) slog.Handler {
	bs := make([]slog.Attr, len(as))
	for i, a := range as {
		bs[i] = bound(a)
	}
	return handler{h.h.WithAttrs(bs)}
}

func (h handler) WithGroup(name string) slog.Handler { return handler{h.h.WithGroup(name)} }

// tooLong reports whether bound would change a.
func tooLong(a slog.Attr) bool {
	switch a.Value.Kind() {
	case slog.KindString:
		return keys[a.Key] && len(a.Value.String()) > Max
	case slog.KindGroup:
		for _, g := range a.Value.Group() {
			if tooLong(g) {
				return true
			}
		}
	case slog.KindLogValuer:
		return tooLong(slog.Attr{Key: a.Key, Value: a.Value.Resolve()})
	}
	return false
}

// bound returns a with its value shortened if its key is one of keys, and the
// same for the attributes of a group.
func bound(a slog.Attr) slog.Attr {
	if !tooLong(a) {
		return a
	}
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		g := v.Group()
		bs := make([]any, len(g))
		for i, x := range g {
			bs[i] = bound(x)
		}
		return slog.Group(a.Key, bs...)
	}
	return slog.String(a.Key, String(v.String()))
}
