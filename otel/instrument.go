package inboxotel

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/inbox"
)

// ScopeName names the tracer and the meter of this package.
const ScopeName = "github.com/inboxgo/inbox/otel"

// Options chooses where spans and metrics go. The zero value uses the
// global providers (otel.SetTracerProvider, otel.SetMeterProvider; set
// later, they still apply) and W3C Trace Context with Baggage.
type Options struct {
	// TracerProvider creates the tracer. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider creates the meter. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Propagator extracts the producer's trace context from the message
	// headers. Default W3C Trace Context and Baggage, whatever the global
	// propagator is: that is what producers put into Kafka headers.
	Propagator propagation.TextMapPropagator
}

// ErrAlreadyInstrumented is returned for an inbox.Config that
// InstrumentConsumer or InstrumentInbox already instrumented: a second
// instrumentation would count every message twice.
var ErrAlreadyInstrumented = errors.New("inboxotel: the inbox configuration is already instrumented")

// ours holds the *inbox.Trace values this package made, to recognise an
// inbox.Config it already instrumented (copies of a Config share the
// pointer).
var ours sync.Map

// InstrumentConsumer instruments a consumer and its inbox: call it once,
// before inbox.New(db, store, *ic), with the inbox's configuration ic and
// the consumer's cc (whose Inbox is set afterwards). It sets
//   - ic.Trace: the message, claim and handler spans;
//   - ic.OnEvent: durations and transaction retries (a hook already there
//     is still called, after it);
//   - cc.MessageContext: extraction of the producer's trace context from
//     the headers (a hook already there then runs on the extracted
//     context);
//   - cc.OnEvent: message outcomes, message and batch retries, dead
//     letters and lag (a hook already there is still called, after it).
//
// Outcomes are counted from the consumer's events only, so each message is
// counted once (see the package documentation). ic may be nil for a
// naturally idempotent consumer without inbox: there are then no message
// spans, but the handler's context still continues the producer's trace.
//
// It returns an error wrapping ErrAlreadyInstrumented if ic was already
// instrumented, and an error if ic already has a Trace of its own, if ic is
// nil for a consumer that needs an inbox, if cc.Inbox is already built (it
// would not get ic's hooks), or if the meter refuses an instrument.
func InstrumentConsumer(ic *inbox.Config, cc *consumer.Config, opts Options) error {
	if cc == nil {
		return errors.New("inboxotel: InstrumentConsumer needs the consumer's configuration")
	}
	if ic == nil && !cc.NaturallyIdempotent {
		return errors.New("inboxotel: InstrumentConsumer needs the inbox's configuration, before inbox.New")
	}
	if cc.Inbox != nil && !cc.NaturallyIdempotent {
		return errors.New("inboxotel: consumer.Config.Inbox is already built and would not get the inbox's hooks; call InstrumentConsumer before inbox.New")
	}
	if err := checkFree(ic); err != nil {
		return err
	}
	t, err := newTelemetry(opts, cc.Consumer, cc.GroupID)
	if err != nil {
		return err
	}
	if ic != nil {
		t.hookInbox(ic, false)
	}
	extract := MessageContext(t.prop)
	if user := cc.MessageContext; user != nil {
		cc.MessageContext = func(ctx context.Context, msg *consumer.Message) context.Context {
			ctx = extract(ctx, msg)
			if uctx := user(ctx, msg); uctx != nil {
				return uctx
			}
			return ctx
		}
	} else {
		cc.MessageContext = extract
	}
	user := cc.OnEvent
	cc.OnEvent = func(ev consumer.Event) {
		t.onConsumerEvent(ev)
		if user != nil {
			user(ev)
		}
	}
	return nil
}

// InstrumentInbox instruments an inbox used without consumer.Consumer: call
// it once, before inbox.New(db, store, *ic). It sets ic.Trace (the message,
// claim and handler spans) and ic.OnEvent (outcomes, durations and retries;
// a hook already there is still called, after it). Each call's outcome is
// counted: a caller that tries a failed message again counts it again. The
// message spans start from the context passed to Process (or to
// ProcessBatch, or from its inbox.MessageContext option): put the
// producer's trace context there.
//
// Consumers use InstrumentConsumer instead. It returns an error wrapping
// ErrAlreadyInstrumented if ic was already instrumented, and an error if ic
// is nil or already has a Trace of its own, or if the meter refuses an
// instrument.
func InstrumentInbox(ic *inbox.Config, opts Options) error {
	if ic == nil {
		return errors.New("inboxotel: InstrumentInbox needs the inbox's configuration")
	}
	if err := checkFree(ic); err != nil {
		return err
	}
	t, err := newTelemetry(opts, "", "")
	if err != nil {
		return err
	}
	t.hookInbox(ic, true)
	return nil
}

// checkFree reports an error if ic cannot take this package's hooks.
func checkFree(ic *inbox.Config) error {
	if ic == nil || ic.Trace == nil {
		return nil
	}
	if _, mine := ours.Load(ic.Trace); mine {
		return ErrAlreadyInstrumented
	}
	return fmt.Errorf("inboxotel: the inbox configuration already has a Trace; combine the hooks yourself or leave it to InstrumentConsumer or InstrumentInbox")
}

// hookInbox sets ic's Trace and OnEvent. countOutcomes says whether the
// inbox's events are the source of the message counts.
func (t *telemetry) hookInbox(ic *inbox.Config, countOutcomes bool) {
	tr := t.trace()
	ours.Store(tr, true)
	ic.Trace = tr
	user := ic.OnEvent
	ic.OnEvent = func(ev inbox.Event) {
		t.onInboxEvent(ev, countOutcomes)
		if user != nil {
			user(ev)
		}
	}
}
