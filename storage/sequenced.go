package storage

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"gorm.io/gorm"
)

// Sequenced is an optional OutboxStore capability: the outbox table's
// source id and epoch. The relay stamps them, with each row's Shard and Seq,
// on every message with a key (the sequence headers of package header), so
// that within one source and epoch a (shard, seq) pair names one event.
//
// A store keeps both in the database, next to its shards, and makes them in
// Migrate.
type Sequenced interface {
	// Source returns the outbox table's source id and its current epoch.
	//
	// The id is made once per outbox table, when Migrate first makes the
	// table, and never changes: a later Migrate keeps it, and of several
	// processes that run Migrate at the same time on a fresh table all end
	// up with the same one. It is unique to the table (NewSourceID makes
	// one) and valid by ValidSource. The epoch starts at 1.
	Source(ctx context.Context, db *gorm.DB) (id string, epoch int64, err error)

	// BumpEpoch raises the epoch by one and returns the new value; every
	// Source call that starts after it returned sees that value (or a
	// higher one) and the same id. The relay of an aligned outbox calls it
	// when its partitions show the database went back (numbers it had
	// published are handed out again to other events); operators may call
	// it at any time.
	BumpEpoch(ctx context.Context, db *gorm.DB) (epoch int64, err error)
}

// SourceClaimer is an optional capability of an OutboxStore that is
// Sequenced: a relay cycle that stamps sequence headers claims and reads
// the source and epoch in one call, where the database can do both in
// fewer round trips than Claim and Source apart. The conformance check
// outbox-sequence/claim-source holds it to Claim and Source.
type SourceClaimer interface {
	// ClaimSource claims as Claim does, and returns the outbox table's
	// source id and epoch as Source does, read no earlier than the claim
	// began: a BumpEpoch that returned before the call is seen. With no
	// rows, id and epoch may be empty.
	ClaimSource(ctx context.Context, db *gorm.DB, req ClaimRequest) (rows []OutboxRow, id string, epoch int64, err error)
}

// MaxSourceBytes is the longest source id.
const MaxSourceBytes = 64

// NewSourceID returns a new source id: 32 lowercase hex digits, 128 random
// bits. Adapters call it in Migrate.
func NewSourceID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ValidSource reports whether id can be a source id: 1 to MaxSourceBytes
// bytes of ASCII letters, digits, '-', '_', '.' and ':' (a UUID, random
// hex), which any Kafka client and CloudEvents carry unchanged as a header
// or attribute value.
func ValidSource(id string) error {
	if id == "" || len(id) > MaxSourceBytes {
		return fmt.Errorf("outbox: source id %q must be 1-%d bytes", truncated(id), MaxSourceBytes)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !sourceByte(c) {
			return fmt.Errorf("outbox: source id %q may hold only ASCII letters, digits, '-', '_', '.' and ':'", truncated(id))
		}
	}
	return nil
}

func truncated(s string) string {
	if len(s) > MaxSourceBytes+8 {
		return s[:MaxSourceBytes+8] + "..."
	}
	return s
}

// sourceByte reports whether c may appear in a source id.
func sourceByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':'
}
