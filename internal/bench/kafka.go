package bench

import "context"

// DefaultKafkaEvents is the events produced for the end-to-end benchmark.
const DefaultKafkaEvents = 20000

// KafkaResult is one end-to-end mode.
type KafkaResult struct {
	Mode  string
	Ratio float64
	Result
}

// Kafka is not written yet.
func Kafka(ctx context.Context, b *Backend, brokers []string, n int, o Options) ([]KafkaResult, error) {
	return nil, nil
}
