package consumer

// The positioner: where a partition starts (the group's committed offset or
// the stored one, claimed for this worker's generation), checked against
// the partition's log (logend.go) and, for a recreated topic, against the
// message before the stored offset (recreated.go).

import (
	"context"
	"fmt"
	"time"

	"github.com/inboxgo/inbox/internal/backoff"
	"github.com/inboxgo/inbox/internal/txn"
	"github.com/inboxgo/inbox/storage"
)

// positionSettings are the Config's settings the positioner uses.
type positionSettings struct {
	store            bool          // Config.Offsets.Store
	group            string        // Config.GroupID
	table            string        // Config.Offsets.Table
	logCheckInterval time.Duration // how often an idle partition runs pastLogEnd
}

// positioner finds where a partition starts, and checks that an idle
// partition's next offset is not past the log end.
type positioner struct {
	*part
	positionSettings
	com     *committer  // whose offsets the positions are
	offsets offsetTable // with Offsets.Store

	assigned int64 // the group's committed offset, or transport.FirstOffset / LastOffset
	// takenBy is the generation that took the partition over (see claim);
	// 0 while none did.
	takenBy int32
	// stored is the row the position was read from (Next -1: none), and
	// logStart the log start offset checkLog found.
	stored   storage.OffsetRow
	logStart int64
}

// start is where a partition starts, as locate found it.
type start struct {
	offset int64
	// hasStored says the database had a row for the partition.
	hasStored bool
	// commit says offset is to be committed (and stored) at once: it was
	// a sentinel, or below the log start (see checkLog).
	commit bool
	// beyondEnd is the stop of a partition whose offset is past the log
	// end, or nil.
	beyondEnd *PartitionStoppedError
}

// locate is position, then checkLog: the offset to start at, checked
// against the partition's log. ok is false if ctx ended first or the
// partition was taken over (p.takenBy).
func (p *positioner) locate(ctx, dbCtx context.Context) (s start, ok bool) {
	offset, from, hasStored, ok := p.position(ctx, dbCtx)
	if !ok {
		return start{}, false
	}
	s = start{hasStored: hasStored}
	s.offset, s.commit, s.beyondEnd, ok = p.checkLog(ctx, offset, from)
	return s, ok
}

// position returns the offset to start at, and from, where it came from,
// for messages. ok is false if ctx ended first or the partition was taken
// over (p.takenBy; see claim). checkLog then checks it against the
// partition's log.
//
// Without Offsets.Store it is the group's committed offset (or
// transport.FirstOffset / LastOffset). With Offsets.Store it is the stored offset whenever the
// database has one, also when it is behind the group's: the database's
// position belongs to the state the effects are in. After a failover to an
// asynchronous replica, the effects, inbox rows and stored offset of the
// last commits vanish together while the group's offset in Kafka may
// already be past them; starting at the larger of the two would skip
// exactly those messages. Starting lower only redelivers messages whose
// inbox rows are there, which the inbox absorbs. hasStored reports whether
// the database had a row for the partition; p.stored is that row.
func (p *positioner) position(ctx, dbCtx context.Context) (start int64, from string, hasStored, ok bool) {
	start = p.assigned
	from = fmt.Sprintf("the offset committed by group %q", p.group)
	p.stored = storage.OffsetRow{Next: -1}
	if !p.store {
		return start, from, false, true
	}
	row, found, ok := p.claim(ctx, dbCtx)
	if !ok {
		return 0, "", false, false
	}
	if !found {
		return start, from, false, true
	}
	p.stored = row
	stored := row.Next
	switch {
	case p.assigned >= 0 && stored < p.assigned:
		// A member commits to Kafka only offsets it stored (see
		// storeCommittable): the database lost commits, or the offsets
		// were reset in Kafka alone, or Offsets.Store was off for a while.
		p.log.Warn("starting at the stored offset, behind the group's committed one: the database's position wins (after a database failover its last commits may be gone); the messages in between are delivered again",
			"stored", stored, "group_committed", p.assigned, "redelivered", p.assigned-stored)
	case stored != p.assigned:
		p.log.Info("starting at the stored offset", "stored", stored, "group_committed", p.assigned)
	}
	return stored, fmt.Sprintf("the offset stored for group %q in table %s", p.group, p.table), true, true
}

// claim reads the partition's stored row, claiming it for this worker's
// generation first (storage.OffsetStore's ClaimOffset: from then on the
// writes of older generations are refused), and retries while the database
// fails. found
// is false if there is no row. ok is false if ctx ended first, or if the
// partition was taken over (p.takenBy is then set and the takeover logged).
//
// A row written by a newer generation than this worker's means one of two
// things, and the group coordinator tells which (generationCurrent): this
// member's generation is over (it was paused past its session timeout and
// another member owns the partition now: the zombie stops, writing
// nothing), or this generation is current and the row comes from before
// the group was deleted and recreated, when its generation ids started
// again (the row is taken over: storage.OffsetStore's AdoptOffset). A row
// of an older generation is simply claimed: a failover may have brought back an older
// row, offset and generation alike; the offset checks (Advance) deal with
// that.
func (p *positioner) claim(ctx, dbCtx context.Context) (row storage.OffsetRow, found, ok bool) {
	p.beginDB()
	defer p.endDB()
	for attempt := 1; ; attempt++ {
		cctx, bounded, cancel := txn.WithBound(dbCtx, "the stored offset's read", p.bound)
		row, found, err := p.offsets.Claim(cctx, p.db, p.topic, p.partition, p.genID())
		cancel()
		err = bounded(err)
		if err == nil && (!found || row.Generation <= p.genID()) {
			return row, found, true
		}
		if err == nil {
			p.endDB() // the group coordinator is asked, not the database
			current, ok := p.com.generationCurrent(ctx, row.Next)
			p.beginDB()
			if !ok {
				return row, found, false
			}
			if !current {
				p.takenBy = row.Generation
				p.log.Warn("partition taken over by a newer generation of the group: this member's generation is over (it was paused or cut off longer than its session timeout: a GC pause, a frozen VM, SIGSTOP); its worker stops without writing or committing anything, and the owner goes on",
					"member_generation", p.genID(), "owner_generation", row.Generation, "stored", row.Next)
				return row, found, false
			}
			actx, bounded, cancel := txn.WithBound(dbCtx, "the stored offset's write", p.bound)
			adopted, aerr := p.offsets.Adopt(actx, p.db, p.topic, p.partition, row.Generation, p.genID())
			cancel()
			aerr = bounded(aerr)
			if aerr == nil && adopted {
				p.log.Info("the stored offset names a newer generation than this member's, which the group coordinator confirms as current: the group was recreated (its generation ids started again); the row is taken over",
					"member_generation", p.genID(), "row_generation", row.Generation, "stored", row.Next)
				row.Generation = p.genID()
				return row, true, true
			}
			if aerr == nil {
				continue // another writer came first: read the row again
			}
			err = aerr
		}
		wait := p.retryWait(attempt)
		p.log.Warn("cannot read the stored offset; retrying", append([]any{"error", err, "retry_in", wait}, p.host.missingTables(ctx, err)...)...)
		if backoff.Sleep(ctx, wait) != nil {
			return storage.OffsetRow{}, false, false
		}
	}
}
