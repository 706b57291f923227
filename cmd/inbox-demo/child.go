package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/inbox"
)

// childEnv carries a consumer process's configuration. The demo re-executes
// its own binary (a test binary too), so the configuration travels in the
// environment rather than in flags.
const childEnv = "INBOX_DEMO_CONSUMER"

type childConfig struct {
	Backend  backend  `json:"backend"`
	Brokers  []string `json:"brokers"`
	Topic    string   `json:"topic"`
	Group    string   `json:"group"`
	Name     string   `json:"name"`
	EventLog string   `json:"event_log"` // one line per outcome is appended here
	Session  string   `json:"session"`   // session timeout
}

// runChild is a consumer process: it consumes until SIGTERM or SIGINT, or
// until it is killed.
func runChild(raw string, stderr io.Writer) int {
	var cfg childConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintf(stderr, "inbox-demo consumer: bad %s: %v\n", childEnv, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := consume(ctx, cfg, stderr); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "inbox-demo consumer %s: %v\n", cfg.Name, err)
		return 1
	}
	return 0
}

func consume(ctx context.Context, cfg childConfig, stderr io.Writer) error {
	session, err := time.ParseDuration(cfg.Session)
	if err != nil {
		return err
	}
	db, store, err := cfg.Backend.open()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError})).With("consumer", cfg.Name)
	ib, err := inbox.New(db, store, inbox.Config{Logger: log})
	if err != nil {
		return err
	}
	events, err := os.OpenFile(cfg.EventLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer events.Close()
	c, err := consumer.New(consumer.Config{
		Brokers:           cfg.Brokers,
		GroupID:           cfg.Group,
		Topics:            []string{cfg.Topic},
		Inbox:             ib,
		Consumer:          "inventory",
		Handler:           handler(cfg.Backend),
		BatchSize:         10,
		BatchWait:         20 * time.Millisecond,
		SessionTimeout:    session,
		HeartbeatInterval: session / 4,
		RebalanceTimeout:  2 * session,
		Logger:            log,
		OnEvent:           logOutcome(events),
	})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

func handler(b backend) consumer.Handler {
	return func(ctx context.Context, tx *gorm.DB, m consumer.Message) error {
		var o order
		if err := json.Unmarshal(m.Value, &o); err != nil {
			return fmt.Errorf("order %s: %w", m.EventID, err)
		}
		return b.reserve(ctx, tx, o)
	}
}

// logOutcome appends "P" or "D" per processed or duplicate message and "A"
// per partition assignment, one
// unbuffered write each, so a killed process loses at most the line of the
// message it was on.
func logOutcome(w io.Writer) func(consumer.Event) {
	return func(e consumer.Event) {
		switch e.Kind {
		case consumer.EventProcessed:
			_, _ = w.Write([]byte("P\n"))
		case consumer.EventDuplicate:
			_, _ = w.Write([]byte("D\n"))
		case consumer.EventAssigned:
			_, _ = w.Write([]byte("A\n"))
		}
	}
}
