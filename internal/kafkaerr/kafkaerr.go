// Package kafkaerr tells kafka-go's producer errors that retrying cannot
// cure from those that pass, for every writer of this project: the
// consumer's dead letters and the outbox relay.
package kafkaerr

import (
	"errors"
	"io"

	"github.com/segmentio/kafka-go"
)

// permanentErrors are the producer errors that retrying a write cannot cure:
// the message, the topic, the credentials or the writer's configuration
// must change. A custom writer marks an error permanent by wrapping one of
// them.
var permanentErrors = []error{
	kafka.MessageSizeTooLarge, // also kafka-go's client-side MessageTooLargeError
	kafka.RecordListTooLarge,
	kafka.InvalidTopic,
	kafka.InvalidRecord,
	kafka.InvalidTimestamp,
	kafka.InvalidRequiredAcks,
	kafka.InvalidRequest,
	kafka.InvalidConfiguration,
	kafka.PolicyViolation,
	kafka.UnsupportedVersion,
	kafka.UnsupportedForMessageFormat,
	kafka.UnsupportedCompressionType,
	kafka.TopicAuthorizationFailed,
	kafka.ClusterAuthorizationFailed,
	kafka.TransactionalIDAuthorizationFailed,
	kafka.SASLAuthenticationFailed,
	kafka.UnsupportedSASLMechanism,
	io.ErrClosedPipe, // the Writer was closed
}

// Classify tells whether a producer's write error is
// permanent, and whether it says the topic is unknown (permanent only once
// it persists: the caller counts the attempts). Anything else (no
// leader, timeouts, the network, errors it does not know) is transient.
// kafka.WriteErrors, which does not unwrap, is looked into: cause is the
// error inside it that decided (err itself otherwise).
func Classify(err error) (permanent, unknownTopic bool, cause error) {
	errs := []error{err}
	var we kafka.WriteErrors
	if errors.As(err, &we) {
		errs = errs[:0]
		for _, e := range we {
			if e != nil {
				errs = append(errs, e)
			}
		}
	}
	cause = err
	for _, e := range errs {
		for _, p := range permanentErrors {
			if errors.Is(e, p) {
				return true, false, e
			}
		}
		if errors.Is(e, kafka.UnknownTopicOrPartition) {
			unknownTopic, cause = true, e
		}
	}
	return false, unknownTopic, cause
}

// UnknownTopicAttempts is how many publish attempts in a row must find the
// topic unknown before that counts as permanent: a topic just created is
// unknown to some brokers for a moment.
const UnknownTopicAttempts = 10
