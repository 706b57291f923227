package consumer

import (
	"fmt"

	"github.com/inboxgo/inbox/storage"
)

// EventKind says what an [Event] reports.
type EventKind int

const (
	// EventProcessed: a message's effect committed.
	EventProcessed EventKind = iota + 1
	// EventDuplicate: the inbox already held the message; nothing applied.
	EventDuplicate
	// EventRetry: a message (or, with Offset -1, a whole batch) failed and
	// will be tried again after a backoff; Err says why.
	EventRetry
	// EventDeadLettered: a message was published to the dead-letter topic.
	EventDeadLettered
	// EventPartitionStopped: a partition halted at Offset (see
	// PartitionStoppedError); Err, a *PartitionStoppedError, says why.
	EventPartitionStopped
	// EventCommitted: Offset (the next offset to read) was committed to Kafka.
	EventCommitted
	// EventLag: Lag messages of the partition are behind Offset, the next
	// offset to process, as of the last fetch.
	EventLag
	// EventAssigned and EventRevoked: the partition was assigned to this
	// member (starting at Offset) or taken from it.
	EventAssigned
	EventRevoked
	// EventMaintenance: the inbox's maintenance ran (Config.MaintenanceInterval);
	// Err is set if it failed.
	EventMaintenance
	// EventRepositioned (with Config.StoreOffsets): the partition's stored
	// offset was found behind the one this member had committed (a
	// database failover that lost the last commits); the member resumed
	// from it, at Offset, and applies the messages in between again. Err
	// says what was found.
	EventRepositioned
)

func (k EventKind) String() string {
	switch k {
	case EventProcessed:
		return "processed"
	case EventDuplicate:
		return "duplicate"
	case EventRetry:
		return "retry"
	case EventDeadLettered:
		return "dead-lettered"
	case EventPartitionStopped:
		return "partition-stopped"
	case EventCommitted:
		return "committed"
	case EventLag:
		return "lag"
	case EventAssigned:
		return "assigned"
	case EventRevoked:
		return "revoked"
	case EventMaintenance:
		return "maintenance"
	case EventRepositioned:
		return "repositioned"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is passed to Config.OnEvent.
type Event struct {
	Kind      EventKind
	Topic     string
	Partition int
	Offset    int64 // the message's offset; for EventCommitted, EventAssigned, EventRepositioned and EventLag the next offset
	Attempt   int   // for EventRetry: the attempt that failed
	Lag       int64 // for EventLag
	Err       error // for EventRetry, EventDeadLettered, EventPartitionStopped, EventRepositioned and a failed EventMaintenance
	// Maintenance is what the inbox's maintenance did, for EventMaintenance.
	Maintenance storage.MaintenanceReport
}
