// Package testtransport picks the Kafka client the project's real-broker
// tests run the consumer on: kafka-go (consumer.Config.Kafka.Transport nil, the
// library's default) or franz-go (transport/franzgo), as the environment
// variable Var says. make test runs the consumer suite, the chaos phases
// and the sequenced end-to-end test once on each.
package testtransport

import (
	"cmp"
	"fmt"
	"os"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/transport/franzgo"
)

// Var names the client: KafkaGo (the default when unset) or FranzGo.
const Var = "INBOX_TEST_TRANSPORT"

// The clients Var may name.
const (
	KafkaGo = "kafka-go"
	FranzGo = "franz-go"
)

// Name returns the client Var names; any other value is an error, so that
// a misspelt name cannot run the suite on the default client unnoticed.
func Name() (string, error) {
	switch v := cmp.Or(os.Getenv(Var), KafkaGo); v {
	case KafkaGo, FranzGo:
		return v, nil
	default:
		return "", fmt.Errorf("%s=%q: want %q or %q", Var, v, KafkaGo, FranzGo)
	}
}

// Apply sets cfg.Transport to the client Var names, over cfg.Brokers; a
// cfg that already has a Transport is left alone. On franz-go the client
// takes cfg.Dialer's client id and dial timeout, which kafka-go would
// have used, and logs to cfg.Logger. A Client serves one Consumer: call
// Apply once per consumer.New.
func Apply(cfg *consumer.Config) error {
	name, err := Name()
	if err != nil {
		return err
	}
	if name == KafkaGo || cfg.Kafka.Transport != nil {
		return nil
	}
	opts := franzgo.Options{Brokers: cfg.Brokers, Logger: cfg.Logger}
	if cfg.Kafka.Dialer != nil {
		opts.ClientID, opts.DialTimeout = cfg.Kafka.Dialer.ClientID, cfg.Kafka.Dialer.Timeout
	}
	cl, err := franzgo.New(opts)
	if err != nil {
		return fmt.Errorf("%s=%s: %w", Var, name, err)
	}
	cfg.Kafka.Transport = cl
	return nil
}
