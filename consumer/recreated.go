package consumer

// The check of a recreated topic that has grown past the stored offset: the
// stored offset carries a fingerprint of the message before it, and on
// assignment that message is fetched again and compared.

import (
	"context"
	"fmt"
	"time"

	"github.com/inboxgo/inbox/transport"
)

// lastCheckTimeout bounds the fetch of the message before the stored
// offset. It is in the log (checkLog saw the log end at or past the stored
// offset), so one fetch brings it at once; a fetch that takes longer only
// leaves the check undone.
const lastCheckTimeout = 5 * time.Second

// checkLast checks, for a partition about to start at its stored offset
// start, that the message before it is the one the group processed last:
// a topic deleted and recreated that has already grown past the stored
// offset looks like the old one by its offsets alone, and starting there
// would skip its messages below start for good (checkLog catches only a
// recreated topic whose log end is still below the offset). It costs one
// fetch per assignment, through the partition's own reader, which it
// leaves positioned anywhere: the caller seeks to start afterwards.
//
// It returns the stop to apply (ReasonTopicRecreated) only when the message
// at start - 1 is there and differs. When it cannot tell it lets the
// partition go on, logging why, and never stops it: the stored row has no
// fingerprint of that message (written by a version without it, or a
// position stored without a message: the group's offset at assignment);
// the message is gone (retention deleted it: start - 1 is below the log
// start; compaction removed it: the reader returns a later offset); or the
// fetch failed or took longer than lastCheckTimeout. ok is false if ctx
// ended first.
func (p *positioner) checkLast(ctx context.Context, reader transport.PartitionReader, start int64) (stop *PartitionStoppedError, ok bool) {
	want := p.stored.Last
	if !p.store || want == 0 || start != p.stored.Next || start <= 0 {
		return nil, true
	}
	if start-1 < p.logStart {
		p.log.Info("cannot check that the topic was not recreated: the message before the stored offset was deleted (retention)",
			"stored", start, "log_start", p.logStart)
		return nil, true
	}
	if err := reader.SetOffset(start - 1); err != nil {
		return nil, true // a closed reader: the caller's seek fails the same way
	}
	fctx, cancel := context.WithTimeout(ctx, lastCheckTimeout)
	m, err := reader.Fetch(fctx)
	cancel()
	switch {
	case ctx.Err() != nil:
		return nil, false
	case err != nil:
		p.log.Warn("cannot read the message before the stored offset to check that the topic was not recreated; starting without the check",
			"offset", start-1, "error", err)
	case m.Offset != start-1:
		p.log.Info("cannot check that the topic was not recreated: the message before the stored offset is gone (compaction)",
			"offset", start-1, "next_present", m.Offset)
	case fingerprint(&m) != want:
		return p.topicRecreated(start), true
	default:
		p.log.Debug("the message before the stored offset is the one processed there", "offset", start-1)
	}
	return nil, true
}

// topicRecreated builds the stop of a partition whose stored offset start
// follows a message other than the one processed there.
func (p *positioner) topicRecreated(start int64) *PartitionStoppedError {
	return &PartitionStoppedError{
		Topic: p.topic, Partition: p.partition, Offset: start, Reason: ReasonTopicRecreated,
		Err: fmt.Errorf("%w: the message at offset %d is not the one group %q processed there before it stored offset %d in table %s (its key, timestamp, headers or value differ): the topic was deleted and recreated, or its messages replaced, and starting at %d would skip the messages below it for good. To start over, %s, then restart",
			errTopicRecreated, start-1, p.group, start, p.table, start, p.resetAdvice()),
	}
}
