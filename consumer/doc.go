// Package consumer runs a Kafka consumer group through an [inbox.Inbox], so
// that each event's effect on the database commits exactly once, whatever
// Kafka redelivers. It runs on any Kafka client that implements package
// transport's contract (Config.Kafka.Transport): github.com/segmentio/kafka-go
// by default, franz-go's with the module
// github.com/inboxgo/inbox/transport/franzgo.
//
// This package is for applications: build a [Consumer] from a [Config] and
// Run it. What differs between databases is behind the adapter the inbox
// was built with (package storage is that contract).
//
// # What it guarantees
//
//   - The effect of a message and its inbox row commit in one transaction;
//     a redelivered event (a producer retry, a crash before the offset commit,
//     a rebalance, a replay under a new group) finds its row and is skipped.
//   - The group's offset of a partition is committed only after the database
//     commit, and only up to the highest contiguous finished offset: a message
//     that has not committed (or been dead-lettered) holds back every offset
//     after it.
//   - One worker per assigned partition: messages of a partition are handled
//     in order, partitions in parallel, and a partition never runs in two
//     workers of one member. On a rebalance the workers of the partitions
//     revoked from this member finish the transaction in flight, commit and
//     stop before the revocation completes, so before another member can
//     fetch them. With kafka-go (eager rebalancing) that is every
//     partition, at every rebalance; with a cooperative client (franz-go's
//     cooperative-sticky) only the partitions that move, and the workers of
//     the partitions the member keeps go on undisturbed. A worker commits
//     only for the partition it was started for.
//   - A message is never skipped silently. One that cannot be processed
//     (retries used up, a permanent handler error, no event id or time,
//     invalid, older than the inbox's retention) goes to
//     Config.Failure.Policy: [DeadLetter] publishes it with headers saying why
//     before its offset may pass, [StopPartition] halts the partition at it.
//     A dead letter the producer refuses for good (too large, a missing or
//     invalid topic, no authorization) halts the partition at the message
//     too, rather than retrying it forever.
//   - Everything transient is retried with backoff, never a reason to stop:
//     an unreachable broker, failed joins, "Rebalance In Progress", a
//     database that cannot commit. Run returns only when its context ends or
//     Close is called, or at once for a setup retrying cannot cure: a
//     configuration the Kafka client rejects, a topic of Config.Topics (or the
//     dead-letter topic) that does not exist ([ErrUnknownTopic]: the
//     consumer never creates topics), a table
//     never migrated ([ErrNotMigrated]). A table dropped while the consumer
//     runs is a database failure, retried until it is back; its retry lines
//     carry missing_table (the table's name) and fix (the Migrate call).
//   - A member whose database stops answering does not keep its partitions:
//     the consumer's own steps give up after Config.Timeouts.Database, and
//     after Config.Timeouts.ProcessingStall the member leaves the group, so that
//     the others take over, until its database answers again (see
//     "Database timeouts").
//
// # Event ids
//
// The inbox key is the producer's event id and time, read by an [Extractor]:
// by default the headers event_id / event_time (RFC 3339), or the CloudEvents
// binary mode headers ce_id / ce_time. A message without them goes to the
// failure policy; it is never processed without deduplication.
// [ProvenanceExtractor] (topic/partition/offset and the broker timestamp) is
// there for producers that set no id; choose it explicitly, knowing that it
// covers redelivery by the consumer only, not a producer's duplicates.
//
// Config.Consumer names the effect in the inbox key. Keep it when the group
// changes: a replay of the topic under a new GroupID must find the old
// group's rows.
//
// # Batches
//
// With Config.BatchSize > 1 up to that many messages of one partition (what
// arrives within Config.BatchWait while the partition holds more; a batch
// whose last message was the partition's last as the broker last said goes
// at once, after a millisecond's grace) are processed in one transaction by
// [inbox.Inbox.ProcessBatch]. A poison message is isolated: the rest of the
// batch commits, and the poison is retried alone and then sent to the policy.
// A Config.BatchHandler receives the new messages of such a batch
// (duplicates left out, in offset order) in one call, through
// [inbox.Inbox.ProcessBatchFunc]; when it fails, the batch is split until
// the failing message is alone, whose attempts then count as with a
// Handler. Config.Timeouts.Handler bounds one call.
// The retried message is then applied after the later messages of its batch:
// order within a partition holds for everything but a message that failed.
//
// That is why BatchSize is 1 by default, though a batch costs one
// transaction and one claim for all its messages: with a per-message
// Handler, BatchSize 100 ran about 5x the default on PostgreSQL
// (docs/BENCHMARKS.md). Batching what is already fetched adds no latency (a
// batch that reached the partition's end goes at once), and a poison
// message is still isolated; what changes is the order of a message whose
// handler fails and then succeeds on a retry (a handler that returns an
// error until an event it depends on arrived is the usual case), and that
// the handlers of a failed message's neighbours run again after the
// rollback, so that a side effect outside tx (which a handler must not
// have) is repeated; the batch's transaction also holds its row locks for
// all its handlers. Choose a batch where none of this matters.
//
// # Offsets in the database
//
// With Config.Offsets.Store the next offset of each partition is written to a
// table (inbox_offsets: group_id, topic, partition, next_offset, and the
// writer's group generation and a fingerprint of the message before the
// offset; create it, or add the later columns to an older one, with
// [Consumer.Migrate]), kept by the inbox's adapter (its Store implements
// storage.OffsetStore, as the three adapters here do), in the same
// transaction as the effect, and each
// assigned partition starts at that offset whenever the database has one,
// even when it is behind the group's committed offset (the group's is used
// for a partition without a row, and then stored). A crash between the
// database commit and the Kafka commit then redelivers nothing; the inbox
// still catches the producer's duplicates. A database failover that loses
// the last acknowledged commits (asynchronous replication) takes their
// stored offset with them, so the consumer applies those messages again,
// exactly once, where resuming from the group's offset would skip them.
// The stored offset never passes a message that is not finished, and the
// group's committed offset never passes the stored one: an offset no
// transaction of its messages stored (duplicates a watermark covers, the
// rest of a batch whose failed message was retried alone) is stored before
// it is committed to Kafka, in one small transaction per commit. Writing
// it costs one small upsert per processed message. Since the stored offset
// wins over the group's, reset a group's position with inboxctl offsets
// reset, which moves both, with the group stopped (inboxctl offsets show
// lists them).
//
// In detail: Config.Offsets.Store writes each partition's next offset into
// Config.Offsets.Table in the same transaction as the effect, and starts each
// assigned partition at that stored offset whenever the database has
// one, whether it is ahead of the group's committed offset or behind
// it; the group's is used only for a partition without a row, and the
// offset it resolves to is then stored at once. The offset after a
// dead-lettered message is stored too (retried while the database
// fails). Where no transaction stores a finished message's offset (a
// batch of duplicates that a watermark of Sequenced.Sources covers runs
// none; the messages of a batch after one that failed commit without
// it, and that one, retried alone, stores its own), it is stored in a
// transaction of its own before it is committed to Kafka: once per
// commit (Kafka.CommitInterval), not per batch; if that write fails, only the
// stored offset is committed. The group's committed offset is thus
// never ahead of the stored one unless the database lost commits. A
// crash between the database commit and the Kafka commit then causes
// no redelivery. Call Migrate first.
//
// Why behind too: after a failover to an asynchronous replica the last
// commits the old primary acknowledged are gone, effects, inbox rows and
// stored offset together, while the group's offset in Kafka may already
// be past them. Resuming from the database's position applies them
// again, exactly once; resuming from the group's would lose them (see
// docs/RELIABILITY.md, "Failover", for what survives which failover).
// A consumer that keeps running through the failover notices it too:
// each write of the stored offset checks that the database still holds
// the last offset this member stored (and an idle partition checks every
// 5 s); if it does not, the transaction rolls back and the partition
// resumes from the database's position (EventRepositioned, a Warn). The
// watermarks of Sequenced.Sources went back with it: they are read again
// there, and a sequence gap met while the stored offset is behind what the
// member stored resumes the partition the same way instead of stopping it.
// Without Offsets.Store such a failover loses those effects.
//
// Each row also names the group generation of the member that wrote it,
// and a write from an older generation than the row's is refused, in
// the same UPDATE: a member paused past Kafka.SessionTimeout (a GC pause, a
// frozen VM, SIGSTOP) has lost its partitions when it resumes, but its
// workers run on until its next heartbeat tells it; a write of such a
// zombie would move the stored offset back under the new owner, which
// would take that for a failover and redeliver everything in between.
// A member claims the rows of the partitions it is assigned (raising
// their generation to its own) before it reads their position, so a
// zombie is refused from the moment the new owner starts. The two cases
// are told apart by the row: a generation newer than the writer's means
// the writer is the zombie (its worker stops, with a Warn "partition
// taken over by a newer generation", rolling back what it was doing: no
// Error, no message failure, and the owner notices nothing); an offset
// behind the writer's with a generation that is not newer means a
// failover (a promoted database may hold an older offset and an older
// generation: it is repositioned as above). Kafka starts a group's
// generation ids again when the group is deleted and recreated, so a
// row's newer generation is believed only after the group coordinator
// refuses this member's commit (unknown member, illegal generation); if
// the coordinator accepts it, this generation is current, the row is
// from the group's earlier life, and the member takes it over (an
// Info). Fencing needs every member on a version that writes the
// generation (Migrate adds the column; older members leave it as it is).
//
// A member frozen in the middle of a transaction keeps that
// transaction open, with its row locks: the new owner waits on them
// (claiming the same inbox rows, the offsets row, or the rows the
// handler changed) until the frozen member resumes and commits or rolls
// back, or the database ends the transaction. The owner gives each of
// its steps up after Timeouts.Database and retries it as a database
// failure (no attempt counted; a lock timeout, 55P03 or 1205, is the
// same), and after Timeouts.ProcessingStall of that it leaves the group and
// rejoins. Only the database can end the frozen transaction: set
// PostgreSQL's idle_in_transaction_session_timeout or MariaDB's
// idle_transaction_timeout (or idle_write_transaction_timeout;
// wait_timeout closes any idle connection) below Timeouts.ProcessingStall and
// above Timeouts.Handler + Timeouts.Database (a handler's own work keeps its
// transaction idle too). A frozen member whose session was ended finds
// its connection gone when it resumes: that transaction fails once
// (logged by the inbox at Error, as for any lost connection), and its
// retry is refused as a zombie's. On SQLite the frozen transaction holds
// the database's only write lock: every writer waits until it ends.
//
// The stored offsets win over the group's: resetting the group's offsets
// in Kafka (to replay, to skip, or after the topic was recreated) has no
// effect until the group's rows in Offsets.Table are reset or deleted too:
// inboxctl offsets reset moves both, with the group stopped. A
// replay under a new GroupID needs nothing: its rows do not exist yet.
// Delete a group's rows as well when Offsets.Store is turned off: turned
// on again, it would resume from where the rows were left.
//
// On assignment the start offset (with or without Offsets.Store) is
// checked against the partition's log, and so is the next offset of a
// partition idle for 30 s. Past the log end (the topic was deleted and
// recreated) for three lookups a second apart, the partition stops with
// ReasonOffsetBeyondLogEnd, wrapping ErrOffsetBeyondLogEnd, until its
// offsets are reset and it is reassigned: waiting there would silently
// never process the new messages below it. Below the log start
// (retention deleted messages the group never processed) the partition
// starts at the log start: those messages are gone; a Warn says how
// many were skipped.
//
// A recreated topic that has already grown past the stored offset
// passes those checks, so the row also holds a fingerprint of the
// message before the stored offset (a hash of its key, timestamp,
// headers and value, never of its offset), and on assignment that
// message is fetched again (one fetch) and compared: another message
// there stops the partition (a *PartitionStoppedError with Reason
// ReasonTopicRecreated), saying how to reset. When the check cannot be made
// the partition starts without it, logged at Info (a failed fetch at
// Warn), and is never stopped: the message was deleted by retention or
// removed by compaction, the fetch failed or took more than 5 s, or the
// row has no fingerprint (a position stored without a message, such as
// the group's offset at the first assignment, or a row last written by
// an older version). It is an assignment-time check: a topic recreated
// under a running consumer that grows past its offset before the next
// rebalance is not caught.
//
// # Sequenced dedup
//
// A message published by this library's outbox relay carries its place in
// the outbox (the sequence headers of package header: source, epoch,
// shard, sequence number, and, from an aligned outbox, the partition
// count). For the sources listed in Config.Sequenced.Sources (their
// header.SeqSource ids: inboxctl outbox source prints a table's, and in
// code the producer's outbox store tells it, storage.Sequenced's Source)
// whose shards are aligned with the topic's partitions (package outbox, "Aligned
// shards": the relay says so in the partitions header) the consumer
// deduplicates by that place instead of an inbox row: per stream
// (consumer, source, epoch, topic, partition) it keeps the highest number
// applied, in one row of the store's watermark table
// (storage.WatermarkStore), loaded when the partition is assigned and moved
// with a compare-and-set in each transaction that applies messages of the
// stream. A number at or below it is a duplicate and costs the database
// nothing; a number above it is new, applied, and the watermark moves in
// the same transaction. The table never needs expiry, and no row is
// written per event. Every other message takes its inbox row as before, in
// the same batches: one without sequence headers, one of a source that is
// not listed (logged once per source at Info with its id, so that a
// mistyped id is found), and one of a listed source that is not aligned
// (logged once per source at Warn: "trusted source is not aligned").
// Config.Consumer names the scope: two consumers with different names keep
// separate watermarks.
//
// Why only aligned sources: a number must name one event. A producer's
// database restored from a backup (or failed over with loss, or cloned)
// hands numbers already published out again to new events; on an aligned
// source each stream holds one shard, all of its numbers, so the partition
// is where that can be seen, but an unaligned source's shard spans
// partitions and nothing witnesses it cheaply: a watermark would skip the
// new events as duplicates. Their inbox rows, keyed by event id, apply
// them.
//
// It rests on what the relay guarantees: within a source and epoch a
// (shard, number) pair names one event; on a partition the first copy of
// each message arrives after the first copies of its shard's earlier
// messages. So only sources published by this library's relay may be
// listed. When the outbox's database goes back (a restore, a failover that
// lost commits), the relay of an aligned outbox finds out from the
// partitions and keeps the promise by itself: it does not send again what
// was published, and publishes under a new epoch where numbers would repeat
// (package outbox, "A producer database that goes back"). No operator step
// is needed; raising the epoch by hand stays safe.
//
// What the consumer does about the ways this could go wrong:
//   - A number that comes again for another event (two relays racing on
//     one partition, such as a cloned database's beside the original's):
//     the first copy on the partition wins, and the later event is skipped
//     as its relay expects; the relay finds its lost race in the partition
//     and publishes the event again under a new epoch, where it is applied.
//     A batch holding both copies is run in two parts, so that the
//     watermark, not the batch, decides the second. The consumer logs the
//     skip at ERROR, naming both events, when it saw the number's first copy
//     committed itself (the last 1024 numbers of each shard since the
//     partition was assigned); a copy of an older number is a duplicate
//     like any other.
//   - A message that fails inside its batch holds back the later messages
//     of its shard: none of them commits before it is resolved, or the
//     watermark would pass it and its retry would look like a duplicate.
//     They are not charged an attempt.
//   - A dead-lettered message moves the watermark past it, in a
//     transaction of its own. Its dead letter carries its sequence headers
//     renamed (header.DLQSequencePrefix: inbox_seq becomes dlq_inbox_seq,
//     the values kept for inspection), so a redrive that copies the dead
//     letter back onto the topic as it is (inboxctl deadletters redrive)
//     takes the inbox row, and the event is applied once.
//   - Another member writing the stream (this one was paused past its
//     session, is a zombie after a rebalance, or its database failed over)
//     makes the compare-and-set fail: the transaction rolls back, the
//     watermarks are read again, and what the other member applied is a
//     duplicate.
//   - The consumer's own database failed over and lost commits: with
//     Offsets.Store the partition resumes from the stored offset, which went
//     back with the watermarks and the effects, and reads the watermarks
//     again, so the messages in between are applied again, once (a gap the
//     older watermark shows is then no gap). Without Offsets.Store such a
//     stream shows a gap and stops, as any stream whose watermark went back.
//   - A stream switched from inbox rows: until Config.Sequenced.RowsUntil
//     a sequenced message also claims its row, so a copy of a message
//     applied through a row before the switch is not applied again.
//   - A trusted source's message with missing or malformed sequence
//     headers is invalid (ReasonInvalid): nothing is guessed. This holds
//     for an unaligned source's message too, though it would take its row.
//
// Each stream is contiguous, so a number past the next one expected means
// a message was lost or reordered upstream: the partition stops at it
// ([ReasonSequenceGap], naming the stream and the missing numbers), or,
// with Config.Sequenced.AcceptGaps, the gap is logged at ERROR and
// accepted. A new group, or a topic whose head retention deleted, starts
// each stream at the first number it sees. A compacted topic cannot use
// gap detection: compaction removes numbers.
//
// Upgrading from a version that deduplicated unaligned sources by
// watermark: an unaligned source's earlier watermark is no longer
// consulted (its row stays in the table, unused; inboxctl watermarks lists
// it, and it may be deleted), and its messages take inbox rows from the
// first one the new version reads. A copy of a message the old version
// applied by that watermark, read after the upgrade (a redelivery after a
// crash before the offset commit, a relay's republication), has no row and
// is applied again. Stop the old consumers cleanly (their offsets
// committed) with the relays caught up before starting the new ones, or
// align the outbox first.
//
// # Paused members
//
// A member paused longer than its session timeout (a GC pause, a frozen VM,
// SIGSTOP) loses its partitions to other members, but when it resumes its
// workers carry on until its next heartbeat tells it. Its Kafka commits are
// refused; with Offsets.Store its writes of the stored offset are refused
// too, because each row names the generation that wrote it and the new
// owner claims its rows when it is assigned: the zombie's transaction rolls
// back, it logs "partition taken over by a newer generation" at Warn and
// its worker stops, and the owner sees nothing of it. (A client that ends
// a partition's function when the coordinator refuses its commit, as
// franz-go's transport does, may stop the worker before it writes again.)
// A row whose offset
// went back with a generation that is not newer is a database failover
// instead, and is repositioned (see "Offsets in the database", which also
// says how a recreated group, whose generation ids start again, is told
// from a zombie). A member frozen inside a transaction holds its locks
// until it resumes or the database ends the transaction: the new owner
// waits for them ("Offsets in the database" names the server settings
// that bound the wait).
//
// # Start offsets
//
// On assignment each partition's start offset is checked against its log,
// and so is the next offset of a partition idle for a while. A stored or
// committed offset past the log end (the topic was deleted and recreated)
// stops the partition with [ReasonOffsetBeyondLogEnd] rather than waiting
// there while the new messages below it go unprocessed; the error says how
// to reset. A recreated topic that has already grown past the stored
// offset is caught by the message before it: with Offsets.Store the row
// holds its fingerprint, and a different message there stops the partition
// with [ReasonTopicRecreated] (when that message is gone, to retention or
// compaction, the check is skipped with an Info, never a stop). One below
// the log start (retention deleted unprocessed messages) starts at the log
// start with a Warn saying how many were skipped. A partition without any
// offset starts at the log start or end (Config.Kafka.StartOffset) and
// commits that offset at once, so a restart never skips what was produced
// in between: with kafka.LastOffset, messages produced while the consumer
// was down are then processed, not skipped.
//
// # Naturally idempotent handlers
//
// An effect that is the same however often it runs (an upsert of the latest
// state, UPDATE ... SET status = 'shipped', a version check) needs no inbox
// row. Set Config.NaturallyIdempotent and give Config.DB and
// Config.Classifier (the adapter's Store, which tells a failing database from
// a failing message) instead of an Inbox (see Example_naturallyIdempotent):
// every delivery runs the handler, each message in its own transaction on
// DB, and a message without event id is processed all the same
// (Message.EventID is then empty). Config.BatchSize applies to a
// BatchHandler only: a batch runs in one transaction without inbox rows,
// and if it fails for a message, its messages are run one by one. Never do
// this for increments such as reserved = reserved + n.
//
// # What is retried, and how often
//
// A message's attempts count only its own failures: the handler's errors
// (also its network errors, EOFs from a decoder and its own deadlines,
// whether marked with inbox.Retryable or not), a panic (an
// *inbox.PanicError, whose stack is logged and sent as the dlq_panic_stack
// header), Config.Timeouts.Handler, and a COMMIT the database refuses for the
// message (a deferred constraint: an *inbox.CommitError; in a batch the
// messages are then run one per transaction to pin it). After Failure.MaxAttempts
// the failure policy applies; a handler error marked with inbox.Permanent
// (a payload that will never decode), also when wrapped further, sends the
// message to it at once, with [ReasonPermanent]. A failing database is
// retried without limit and without counting attempts: BEGIN, the inbox's
// claim or COMMIT failing, or a statement failing with an error the Store
// classifies as transient (a deadlock, a lock timeout, a lost connection);
// see inbox.IsDatabaseFailure.
// So is a step of the consumer's own that the database did not answer
// within Config.Timeouts.Database, and a Timeouts.Handler that cut short a
// statement while the database did not answer a ping either (see
// "Database timeouts"). After five such retries in a row they are logged
// at Error. A statement that fails this way also dooms its transaction:
// the handler's later statements are refused (inbox.ErrTransactionAborted),
// so a handler that ignores the error cannot commit half an effect.
//
// The consumer owns every retry of the messages it processes, with
// Config.Failure: Failure.MaxAttempts counts a message's attempts, and
// Failure.MinBackoff and Failure.MaxBackoff bound the jittered exponential
// wait between them, between the retries of a failing database, and
// between reconnection tries. The inbox it drives runs each of the
// consumer's transactions once and hands every failure back, so the
// inbox.Config's MaxAttempts, MinBackoff and MaxBackoff do not apply to
// the consumer's messages; they still bound the inbox's own Migrate and
// Maintain (which the consumer's maintenance runs call) and an inbox
// called without a consumer.
//
// # Database timeouts
//
// A database link can fail without a word: a network path, a switch or a
// firewall that drops every packet sends no RST, so a statement on the way
// waits until the kernel gives up on the connection, about 15 minutes
// later, and the member, still heartbeating to Kafka, keeps its partitions
// all that time. Three settings bound it:
//
//   - Config.Timeouts.Database (default 30 s) bounds each of the consumer's
//     own steps: BEGIN (with taking or opening a connection), the inbox's
//     claim, the stored offset's write and read, COMMIT and ROLLBACK. A step
//     past it is a database failure, rolled back and retried without limit
//     and without counting an attempt, as a lost connection is. A COMMIT
//     given up has an unknown outcome (it may commit once the database gets
//     it): the retry then finds the message's inbox row and skips it as a
//     duplicate, so the effect commits once (a naturally idempotent handler
//     runs again, which its effect allows). Drivers that ignore the context
//     in COMMIT or ROLLBACK (go-sql-driver/mysql) keep that connection until
//     they return (their readTimeout, or the kernel); the pool opens another.
//     Choose it above the longest the inbox's own statements may wait for a
//     lock: during a rebalance a claim waits for the previous owner's
//     transaction on the same message. The handler's own statements are
//     bounded by Timeouts.Handler, not by this.
//   - Config.Timeouts.Handler bounds one call of a handler: its context and
//     transaction handle carry the deadline, so its statements are cancelled
//     when it passes; a handler still running or returning after it fails
//     with an error wrapping [ErrHandlerTimeout], its writes are rolled back,
//     and the message counts an attempt. Go code that ignores its context
//     cannot be interrupted: the partition waits for it to return. One case
//     is the database's, not the message's: the deadline cut short a
//     statement the handler sent through tx, and a ping of the database on
//     another connection gets no answer either (within 5 s, or
//     Timeouts.Database if shorter). The batch is then retried as a
//     database failure (no attempt, a Warn). No handler can make the ping
//     fail: it runs no SQL of the handler's, waits on none of its locks,
//     and a slow query of the handler's has been cancelled by then.
//   - Config.Timeouts.ProcessingStall (default the larger of 2 minutes and
//     2 × Timeouts.Database + BatchSize × Timeouts.Handler) bounds how long
//     a partition may wait for the database to answer its work: from the
//     start of a batch (its handlers included) until the batch commits or
//     fails for a reason of a message's own, with every retry of a database
//     failure in between, and the same for reading and writing the stored
//     offset. A member with a partition stalled longer leaves the group, as
//     Kafka's max.poll.interval.ms makes a consumer that stops polling do:
//     the work in flight is cancelled and rolled back (redelivered to the
//     new owner, where the inbox absorbs what had committed), its
//     partitions move to the other members within Timeouts.ProcessingStall
//     plus Kafka.SessionTimeout plus the rebalance, and it rejoins once a
//     ping of its database succeeds. It must exceed Timeouts.Database and
//     Timeouts.Handler, and should exceed the longest a batch may take
//     (BatchSize × Timeouts.Handler): a member leaves the group over a slow
//     batch too.
//
// The driver's own settings bound what these do not (connecting, the idle
// connections of the pool, the connection a given-up COMMIT keeps), and the
// server's end the frozen member's session, which otherwise keeps its
// transaction open and its inbox rows locked: the member that takes over
// the partition waits for those locks until the server ends the session.
//
//   - PostgreSQL through pgx: connect_timeout=5 in the DSN bounds
//     connecting. pgx has no client-side keepalive or tcp_user_timeout
//     keyword (libpq's keepalives, keepalives_idle, ... are sent to the
//     server as settings and refused): set TCP_USER_TIMEOUT, which bounds
//     how long sent data may stay unacknowledged, on a dialer
//     (pgx.ConnConfig.DialFunc: a net.Dialer whose Control sets it; see
//     docs/RELIABILITY.md) and open the pool with stdlib.OpenDB. The
//     server's settings go in the DSN as they are (pgx sends unknown
//     keywords to the server): idle_in_transaction_session_timeout
//     (milliseconds, above Timeouts.Handler plus Timeouts.Database: a handler's
//     own work keeps the transaction idle) ends a session gone silent
//     inside a transaction; tcp_user_timeout, tcp_keepalives_idle,
//     tcp_keepalives_interval and tcp_keepalives_count make the server
//     notice a dead client.
//   - MariaDB through go-sql-driver/mysql: timeout=5s (connecting),
//     readTimeout and writeTimeout (each read and write of a packet; above
//     the longest statement you run, Timeouts.Handler included, or a long
//     query is cut), and, as a session setting in the DSN,
//     idle_transaction_timeout (seconds; MariaDB 10.3 and later; MySQL has
//     none) to end a session gone silent inside a transaction.
//   - SQLite: nothing to set (a local file: no link to freeze).
//
// # Observability
//
// Logs go to Config.Logger (log/slog): retries and transient failures at
// Warn, dead letters and stopped partitions at Error, one line per failed
// attempt (the inbox the consumer drives logs none of them). The values a
// message brings (its event id, its key) are logged shortened to 64
// bytes, as error texts show them. Config.Hooks receive every hooks.Event
// (processed, duplicate, retry, dead-lettered, partition-stopped,
// committed, lag per partition, assigned, revoked, maintenance,
// repositioned), and a [ContextHook] among them gives each message the
// context its handler and its inbox work run under, for tracing.
//
// Give the logger and the hooks once, to the inbox's Config: a consumer
// whose Logger is nil logs to the inbox's (inbox.Config.Logger, else
// slog.Default()), and one whose Hooks is nil takes the inbox's. The
// inbox then traces each message's claim and handler (hooks.MessageTracer,
// ClaimTracer, HandlerTracer) and the consumer reports the events: each
// message's outcome once it is decided, which the inbox it drives does not
// report (see package hooks), so every event reaches a hook once. Hooks of
// the consumer's own (an empty, non-nil list for none) replace the inbox's
// for what the consumer reports; giving the same list to both, as before,
// is the same as giving it to the inbox alone. The module
// github.com/inboxgo/inbox/otel is such a hook.
//
// # Maintenance
//
// Run runs the inbox's maintenance (inbox.Inbox.Maintain: prepare the
// coming days' partitions, expire the days past the retention window) at
// start and then every Config.MaintenanceInterval, logging a failure at
// Error and reporting every run as a hooks.Maintenance event. The default
// interval, an hour, makes a missed run cost nothing: partitions are
// prepared days ahead. A negative interval turns it off; run Maintain
// yourself then (inboxctl maintain, for example). Several consumers running
// it on one inbox is safe (the Store serialises it), only redundant.
//
// # Dead letters
//
// Under [DeadLetter] each dead letter names Config.Failure.DeadLetterTopic,
// so a *kafka.Writer given as Failure.DeadLetterWriter must leave its Topic
// empty (New refuses one that does not), and should accept messages as
// large as the source topics hold (its BatchBytes). The default writer is
// the transport's: kafka-go's is a *kafka.Writer on Config.Brokers that
// requires all in-sync replicas and accepts messages of up to 11 MiB (the
// 10 MiB the partition readers accept plus room for the dead-letter
// headers). Run closes the default writer and its connections when it
// returns.
//
// # Transport
//
// The partition workers (order, offset commits, the failure policy, stored
// offsets, dead letters, the log-end checks) and the group loop reach Kafka
// only through package transport's interfaces: a Client whose Group yields
// generations, a Generation that starts a worker per partition with a
// reader of that partition and commits its offsets, and a lookup of a
// partition's log offsets (package transport states what each must
// guarantee, eager and cooperative rebalancing alike). Config.Kafka.Transport
// takes the Client; nil means kafka-go over [Config.Brokers] and
// Config.Kafka.Dialer, whose group, reader, client and default dead-letter
// writer with their settings are all in transport_kafkago.go. A worker
// belongs to the generation that started it: it writes that generation's
// id into its stored offset rows, and with a cooperative client it goes on
// under that generation for as long as the member keeps the partition.
// Messages are kafka-go's kafka.Message whatever the client, and dead
// letters go through a [MessageWriter].
//
// # Testing handlers
//
// Package github.com/inboxgo/inbox/transport/memtransport is an in-memory
// Kafka cluster for tests: set [KafkaConfig.Transport] to a Client of its
// Cluster (eager, as kafka-go, or cooperative, as franz-go), produce the
// messages there, run the consumer on the test's database until the
// group's committed offset passes them, and check the handler's effects,
// the dead letters and the committed offsets, with no broker. This
// package's own tests run the consumer that way, on SQLite.
package consumer
