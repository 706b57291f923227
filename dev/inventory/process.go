package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/dev/testtransport"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// ProcessEnv carries a consumer process's configuration. Programs re-execute
// their own binary (a test binary too) as consumer processes, so the
// configuration travels in the environment rather than in flags; such a
// program calls [RunProcessFromEnv] first thing in main (or TestMain).
const ProcessEnv = "INBOX_INVENTORY_CONSUMER"

// ProcessConfig configures one consumer process.
type ProcessConfig struct {
	Backend   Backend       `json:"backend"`
	Brokers   []string      `json:"brokers"`
	Topic     string        `json:"topic"`
	Group     string        `json:"group"`
	Name      string        `json:"name"`
	EventLog  string        `json:"event_log"` // one line per outcome is appended here
	Session   time.Duration `json:"session"`   // group session timeout
	BatchSize int           `json:"batch_size"`
	// StoreOffsets runs the consumer with consumer.Config.Offsets.Store,
	// in the backend's OffsetsTable.
	StoreOffsets bool `json:"store_offsets"`
	// DeadLetterTopic, if set, makes the consumer dead-letter a message
	// that cannot be processed (consumer.DeadLetter) instead of stopping
	// its partition. The scenario has no poison: whatever arrives there is
	// a message the infrastructure failed, not the handler.
	DeadLetterTopic string `json:"dead_letter_topic"`
	// DatabaseTimeout and MaxProcessingStall are the consumer's
	// (consumer.Config); 0 keeps its defaults.
	DatabaseTimeout    time.Duration `json:"database_timeout"`
	MaxProcessingStall time.Duration `json:"max_processing_stall"`
	// Warnings logs Warn lines too, not only Error: what a member says
	// when it loses its partitions is logged at Warn and Info.
	Warnings bool `json:"warnings"`
	// Trace, if set, is the file this process writes its trace to (see
	// ReadTrace).
	Trace string `json:"trace"`
}

// RunProcessFromEnv runs a consumer process if ProcessEnv is set, until
// SIGTERM or SIGINT (or until it is killed), and reports ran=true with the
// process's exit code. It returns ran=false otherwise.
//
// With ChainProcessEnv set instead, it runs a relay or consumer of the
// chain scenario ([RunChainProcess]) the same way.
func RunProcessFromEnv(stderr io.Writer) (ran bool, code int) {
	if raw := os.Getenv(ChainProcessEnv); raw != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return runChainFromEnv(ctx, raw, stderr)
	}
	raw := os.Getenv(ProcessEnv)
	if raw == "" {
		return false, 0
	}
	var cfg ProcessConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintf(stderr, "inventory consumer: bad %s: %v\n", ProcessEnv, err)
		return true, 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := Consume(ctx, cfg, stderr); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "inventory consumer %s: %v\n", cfg.Name, err)
		return true, 1
	}
	return true, 0
}

// StartProcess starts this binary again as a consumer process with cfg.
func StartProcess(ctx context.Context, cfg ProcessConfig, output io.Writer) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), ProcessEnv+"="+string(raw))
	cmd.Stdout = output
	cmd.Stderr = output
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start consumer %s: %w", cfg.Name, err)
	}
	return cmd, nil
}

// Consume runs the inventory consumer until ctx ends.
// A database that cannot be reached at start (it is restarting) is waited
// for, as the consumer waits for it once running.
func Consume(ctx context.Context, cfg ProcessConfig, stderr io.Writer) error {
	log := processLogger(stderr, cfg.Warnings).With("consumer", cfg.Name)
	db, store, err := openRetrying(ctx, cfg.Backend, log)
	if err != nil {
		return err
	}
	ib, err := inbox.New(db, store, inbox.Config{Logger: log, MaxAttempts: 20})
	if err != nil {
		return err
	}
	events, err := os.OpenFile(cfg.EventLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer events.Close()
	hks, closeTrace, err := outcomeHooks(events, cfg.Trace)
	if err != nil {
		return err
	}
	defer closeTrace()
	batch := max(cfg.BatchSize, 1)
	onFailure := consumer.StopPartition
	if cfg.DeadLetterTopic != "" {
		onFailure = consumer.DeadLetter
	}
	ccfg := consumer.Config{
		Brokers:   cfg.Brokers,
		GroupID:   cfg.Group,
		Topics:    []string{cfg.Topic},
		Inbox:     ib,
		Consumer:  "inventory",
		Handler:   Handler(cfg.Backend),
		BatchSize: batch,
		BatchWait: 20 * time.Millisecond,
		Kafka: consumer.KafkaConfig{
			SessionTimeout:    cfg.Session,
			HeartbeatInterval: cfg.Session / 4,
			RebalanceTimeout:  2 * cfg.Session,
		},
		Logger: log,
		Hooks:  hks,
		Offsets: consumer.OffsetsConfig{
			Store: cfg.StoreOffsets,
			Table: cfg.Backend.OffsetsTable(),
		},
		Failure: consumer.FailureConfig{
			Policy:          onFailure,
			DeadLetterTopic: cfg.DeadLetterTopic,
		},
		Timeouts: consumer.TimeoutsConfig{
			Database:        cfg.DatabaseTimeout,
			ProcessingStall: cfg.MaxProcessingStall,
		},
	}
	if err := testtransport.Apply(&ccfg); err != nil {
		return err
	}
	c, err := consumer.New(ccfg)
	if err != nil {
		return err
	}
	if cfg.StoreOffsets {
		if err := migrateConsumer(ctx, c, store, db, log); err != nil {
			return err
		}
	}
	return c.Run(ctx)
}

// migrateConsumer creates the consumer's tables (consumer.Consumer.Migrate:
// the offsets table, the watermark table). The database may be
// restarting or failing over: Migrate is tried again while its error is
// transient or the database cannot be reached; any other error is
// returned.
func migrateConsumer(ctx context.Context, c *consumer.Consumer, store storage.InboxStore, db *gorm.DB, log *slog.Logger) error {
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		err := c.Migrate(ctx)
		if err == nil {
			return nil
		}
		if !store.IsRetryable(err) && reachable(ctx, db) {
			return err
		}
		log.Warn("database not reachable for the consumer's tables; waiting", "error", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// processLogger logs at Error, or from Warn with warnings.
func processLogger(w io.Writer, warnings bool) *slog.Logger {
	level := slog.LevelError
	if warnings {
		level = slog.LevelWarn
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// outcomeHooks are a consumer process's hooks: its outcomes into the event
// log and, if trace names a file, its trace there (closed by the returned
// function).
func outcomeHooks(events io.Writer, trace string) ([]hooks.Hook, func(), error) {
	hks := []hooks.Hook{hooks.EventFunc(logOutcome(events))}
	if trace == "" {
		return hks, func() {}, nil
	}
	f, err := os.OpenFile(trace, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, nil, err
	}
	return append(hks, hooks.EventFunc(traceEvents(f))), func() { f.Close() }, nil
}

// reachable reports whether db answers a ping.
func reachable(ctx context.Context, db *gorm.DB) bool {
	sqlDB, err := db.DB()
	return err == nil && sqlDB.PingContext(ctx) == nil
}

func openRetrying(ctx context.Context, b Backend, log *slog.Logger) (*gorm.DB, storage.InboxStore, error) {
	wait := 100 * time.Millisecond
	for {
		db, store, err := b.Open()
		if err == nil {
			return db, store, nil
		}
		log.Warn("database not reachable; waiting for it", "error", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// Handler is the consumer handler: decode the order and reserve its stock.
func Handler(b Backend) consumer.Handler {
	return func(ctx context.Context, tx *gorm.DB, m consumer.Message) error {
		var o Order
		if err := json.Unmarshal(m.Value, &o); err != nil {
			return fmt.Errorf("order %s: %w", m.EventID, err)
		}
		return b.Reserve(ctx, tx, o)
	}
}

// logOutcome appends "P" or "D" per processed or duplicate message ("PW",
// "DW" when its stream's watermark decided it: the consumer's sequenced
// dedup), "A" per partition assignment, "R" per repositioning after a
// database failover, and a StopLine per stopped partition, one unbuffered
// write each, so a killed process loses at most the line of the message
// it was on.
func logOutcome(w io.Writer) func(hooks.Event) {
	return func(e hooks.Event) {
		var line string
		switch e.Kind {
		case hooks.Processed:
			line = "P"
		case hooks.Duplicate:
			line = "D"
		case hooks.Assigned:
			line = "A"
		case hooks.Repositioned:
			line = "R"
		case hooks.PartitionStopped:
			line = stopLine(e)
		default:
			return
		}
		if e.Sequenced {
			line += "W"
		}
		_, _ = w.Write([]byte(line + "\n"))
	}
}

// stopPrefix starts the event log's line of a stopped partition: the
// prefix, then the reason, topic, partition, offset, event id and error,
// separated by tabs (the error's own tabs and newlines become spaces).
const stopPrefix = "STOP"

func stopLine(e hooks.Event) string {
	st := Stop{Topic: e.Topic, Partition: e.Partition, Offset: e.Offset}
	var pse *consumer.PartitionStoppedError
	if errors.As(e.Err, &pse) {
		st.Reason, st.EventID = pse.Reason, pse.EventID
		if pse.Err != nil {
			st.Err = pse.Err.Error()
		}
	} else if e.Err != nil {
		st.Err = e.Err.Error()
	}
	clean := strings.NewReplacer("\t", " ", "\n", " ", "\r", " ").Replace
	return strings.Join([]string{stopPrefix, clean(st.Reason), clean(st.Topic), strconv.Itoa(st.Partition),
		strconv.FormatInt(st.Offset, 10), clean(st.EventID), clean(st.Err)}, "\t")
}

// Stop is a stopped partition, as an event log records it.
type Stop struct {
	Reason    string // a consumer.Reason constant
	Topic     string
	Partition int
	Offset    int64  // the message it stopped at
	EventID   string // that message's, if known
	Err       string // the cause (PartitionStoppedError.Err)
}

// Outcomes are the counts of an event log. Processed and Duplicates count
// both dedup paths; the Watermark counts are the part of them that the
// consumer's sequenced dedup decided.
type Outcomes struct {
	Processed, Duplicates, Assigned, Repositioned int
	WatermarkProcessed, WatermarkDuplicates       int
	Stops                                         []Stop
}

// CountOutcomes reads an event log written by consumer processes.
func CountOutcomes(path string) (Outcomes, error) {
	var o Outcomes
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return o, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		switch line {
		case "P":
			o.Processed++
		case "D":
			o.Duplicates++
		case "PW":
			o.Processed++
			o.WatermarkProcessed++
		case "DW":
			o.Duplicates++
			o.WatermarkDuplicates++
		case "A":
			o.Assigned++
		case "R":
			o.Repositioned++
		default:
			if st, ok := parseStop(line); ok {
				o.Stops = append(o.Stops, st)
			}
		}
	}
	return o, nil
}

// parseStop reads a stopLine; a line cut short (the process was killed
// while writing it) is not one.
func parseStop(line string) (Stop, bool) {
	f := strings.Split(line, "\t")
	if len(f) != 7 || f[0] != stopPrefix {
		return Stop{}, false
	}
	part, err1 := strconv.Atoi(f[3])
	off, err2 := strconv.ParseInt(f[4], 10, 64)
	if err1 != nil || err2 != nil {
		return Stop{}, false
	}
	return Stop{Reason: f[1], Topic: f[2], Partition: part, Offset: off, EventID: f[5], Err: f[6]}, true
}

// SyncWriter serialises writes to w: the output of several consumer
// processes is copied by one goroutine each.
func SyncWriter(w io.Writer) io.Writer { return &syncWriter{w: w} }

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
