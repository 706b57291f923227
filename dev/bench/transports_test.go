package bench

import "testing"

func TestSplitTransport(t *testing.T) {
	for _, tc := range []struct {
		mode, base string
		franz, bad bool
	}{
		{mode: KafkaBatchHandler, base: KafkaBatchHandler},
		{mode: TransportMode(KafkaBatchHandler, TransportKafkaGo), base: KafkaBatchHandler},
		{mode: TransportMode(KafkaSequencedBatchHandler, TransportFranzGo), base: KafkaSequencedBatchHandler, franz: true},
		{mode: TransportMode(KafkaLibraryFree, TransportKafkaGo), base: KafkaLibraryFree},
		{mode: TransportMode(KafkaLibraryFree, TransportFranzGo), bad: true},
		{mode: TransportMode(KafkaBatchHandler, "sarama"), bad: true},
	} {
		base, newClient, err := splitTransport(tc.mode)
		if tc.bad {
			if err == nil {
				t.Errorf("%s: no error", tc.mode)
			}
			continue
		}
		if err != nil || base != tc.base || (newClient != nil) != tc.franz {
			t.Errorf("%s: mode %q, franz-go %v, error %v; want %q, %v", tc.mode, base, newClient != nil, err, tc.base, tc.franz)
		}
	}
}
