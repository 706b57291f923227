package bench

import (
	"fmt"
	"strings"

	"github.com/inboxgo/inbox/transport"
	"github.com/inboxgo/inbox/transport/franzgo"
)

// The Kafka clients the benchmarks run the consumer on, by name.
const (
	TransportKafkaGo = "kafka-go" // consumer.Config.Kafka.Transport nil: the consumer's default
	TransportFranzGo = "franz-go" // transport/franzgo
)

// Transports make each benchmark consumer's Kafka client
// (consumer.Config.Kafka.Transport) by name; kafka-go's is nil, the consumer's
// default.
var Transports = map[string]func(brokers []string) (transport.Client, error){
	TransportKafkaGo: nil,
	TransportFranzGo: func(brokers []string) (transport.Client, error) {
		return franzgo.New(franzgo.Options{Brokers: brokers})
	},
}

// TransportMode names an end-to-end mode run on the named transport, for
// KafkaPaired: "inbox-batchhandler@franz-go". A mode without "@" runs on
// kafka-go.
func TransportMode(mode, transportName string) string {
	return mode + "@" + transportName
}

// splitTransport splits a mode of TransportMode into the mode and the
// transport's factory (nil for kafka-go).
func splitTransport(mode string) (string, func(brokers []string) (transport.Client, error), error) {
	base, name, found := strings.Cut(mode, "@")
	if !found {
		return mode, nil, nil
	}
	newClient, ok := Transports[name]
	if !ok {
		return base, nil, fmt.Errorf("bench: mode %q: unknown transport %q", mode, name)
	}
	if newClient != nil && (base == KafkaLibraryFree || base == KafkaClassicInbox) {
		return base, nil, fmt.Errorf("bench: mode %q: %s is written against kafka-go only", mode, base)
	}
	return base, newClient, nil
}
