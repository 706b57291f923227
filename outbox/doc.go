// Package outbox publishes events atomically with the database change that
// causes them: the transactional outbox, the producer half of the inbox
// pattern.
//
// This package is for applications; the storage contract an adapter
// implements is storage.OutboxStore.
//
// [Outbox.Enqueue] stores messages inside the caller's GORM transaction (a
// handler's transaction from the inbox, or any transaction of the
// application): they exist if and only if that transaction commits. A
// [Relay] publishes them to Kafka through a [Publisher] and marks them
// published once the broker acknowledged them (acks from all in-sync
// replicas). Two publishers come with the library: [KafkaPublisher] over
// kafka-go's writer ([NewKafkaWriter]), and franzgo.Publisher of the module
// github.com/inboxgo/inbox/transport/franzgo, over franz-go's idempotent
// producer, which puts every key on the same partition. A
// relay that dies in between publishes them again, so delivery is at least
// once; every message carries a stable event id and event time in the
// headers the inbox consumer reads (event_id and event_time, or CloudEvents'
// ce_id and ce_time), and the downstream inbox drops the copies.
//
// # Wake-ups
//
// A relay does not wait for a poll to find a commit; it is woken:
//
//   - On PostgreSQL (a store that is a storage.Notifier), Append sends a
//     NOTIFY inside the enqueuing transaction when a shard it appends to
//     has nothing unpublished, which the database delivers at commit, once
//     per transaction, to a connection each relay keeps listening (one
//     connection per relay, outside the application's pool). This reaches
//     relays in every process. A transaction that appends while its shards
//     hold unpublished rows sends none (PostgreSQL serializes the commits
//     of notifying transactions; every one notifying halved the rate of
//     8 writers): a relay is at work then, and polls soon after each cycle
//     that published, as below. Such a transaction that commits long after
//     its Enqueue, once the relay has backed off, waits for the relay's
//     next poll. A relay that loses its listening connection logs it at
//     Warn, polls as below, and listens again.
//   - In the relay's process, on every database, Enqueue wakes the relays
//     made from the same Outbox: after the commit when the transaction is
//     one that tells its commit (an inbox handler's, a consumer's: package
//     inbox and consumer run them), and otherwise at Enqueue, before the
//     commit; the relay then finds nothing yet, and polls again soon.
//   - Between wake-ups every relay polls adaptively:
//     RelayConfig.MinPollInterval after a cycle that found something or
//     followed a wake-up, doubled for each cycle in a row that found
//     nothing, up to RelayConfig.PollInterval.
//
// Whatever the wake-ups, a relay looks at least every PollInterval (the
// safety poll, 1s by default): a lost notification delays a message by at
// most that, and never loses it. An idle relay sends about ten statements
// (its claims) in the first second after activity, then one per safety
// poll. A relay that publishes a full batch goes on at once; after a
// shorter one it starts the next cycle no sooner than 5ms after that
// one's start (MinPollInterval, if shorter), however soon it is woken, so
// that a stream of commits is published several at a time, and a cycle
// that took longer is followed at once. RelayConfig.NoWakeups
// turns the wake-ups off.
//
// # Order per key
//
// Messages with the same topic and key reach Kafka in the order their
// transactions committed, across relay restarts and with several relays.
// The classic trap is numbering rows at INSERT (a sequence, an
// autoincrement): transactions commit in another order than they insert, so
// a relay reading "id > last published" skips a row that commits later with
// a lower id, or publishes it after a higher one. This package never lets
// such a gap form:
//
//   - Every key belongs to one of a fixed number of shards (a hash of topic
//     and key; in an aligned outbox its partition). Enqueue takes the shard's next sequence numbers by updating
//     the shard's counter row inside the caller's transaction, and the row
//     lock it holds until that transaction ends makes the next enqueuer of
//     the shard wait. So within a shard a lower number always commits first
//     (a rolled-back number is handed out again), and the committed rows of
//     a shard are always a gapless prefix of its numbers. The price:
//     concurrent transactions enqueuing for keys of the same shard take
//     turns; more shards, fewer collisions. On SQLite the single writer
//     gives the same order.
//   - A relay publishes, for each shard it leases, the rows right after the
//     shard's published mark, in sequence order, in one synchronous write
//     that the publisher sends as one batch per partition (the relay keeps
//     each cycle within the publisher's limits, [Limited], because a later
//     batch could otherwise succeed after an earlier one failed;
//     franz-go's idempotent producer also fails every later batch of a
//     partition once one failed). It then moves the
//     shard's mark with one UPDATE: outbox rows are written once and never
//     updated. A publish that fails in part marks, per shard, only the
//     messages before the first failure.
//   - Whichever relays run and fail, every run they publish starts at a
//     shard's mark and goes up in order, so the first copy of a message to
//     reach a partition always comes after the first copy of the message
//     before it: the order the downstream inbox applies is the commit
//     order, whatever duplicates arrive.
//
// # Sequence headers
//
// The relay stamps on every message with a key where it stands in its
// shard: four headers (package header) with the outbox table's source id,
// the epoch, the row's shard and its sequence number in the shard:
// inbox_source, inbox_epoch, inbox_shard and inbox_seq, or in the
// CloudEvents style ce_inboxsource, ce_inboxepoch, ce_inboxshard and
// CloudEvents' own sequence extension, ce_sequence, zero-padded to 19
// digits so that its string order is the numbers' order. The numbers come
// from the stored row and the source and epoch from the store, read on
// every cycle, so every copy of a message carries the same four values
// (within one epoch). Within a shard the numbers are those of the order
// section above: gapless (counting the shard's messages without a key,
// which carry none), in commit order, and the first copy of each message
// reaches its partition after the first copy of every earlier message of
// its shard there. A partition sees the numbers of many shards,
// and of each only those of its own keys: they go up, with holes (in an
// aligned outbox, below, a partition sees all the numbers of one shard).
//
// A message without a key gets no sequence headers: the writer's balancer
// spreads such messages over the partitions, so no order per partition
// can be promised for them (except in an aligned outbox, below).
//
// The source id is made once, when Migrate first makes the outbox table,
// and never changes; the epoch starts at 1 and is raised by the relay
// itself when it finds the database went back (below), or by an operator
// (inboxctl outbox bump-epoch, or the store's BumpEpoch), which is always
// safe: rows already published are not sent again under the new epoch.
//
// They are on whenever the store implements [storage.Sequenced] (this
// library's adapters do); Config.NoSequenceHeaders turns them off. While
// they are on, Enqueue refuses messages that carry headers of their names.
// A consumer that lists the source in consumer.Config.Sequenced.Sources
// deduplicates an aligned outbox's messages (below) by them, with a
// watermark per stream instead of an inbox row per event; the messages of
// an outbox that is not aligned it deduplicates by event id, as any other.
//
// # Aligned shards
//
// By default a shard holds keys of many topics and partitions, so the
// consumer of a partition sees each shard's numbers with holes, and cannot
// tell a lost message from one that went elsewhere. Config.AlignedTopic
// makes every (source, epoch, topic, partition) stream contiguous: the
// outbox serves that one topic (Enqueue refuses a message for another),
// and its shards are the topic's partitions. A message's shard is the
// partition Kafka's default partitioner gives its key, toPositive(murmur2(key))
// modulo the shard count (the Java client's, and kafka.Murmur2Balancer's),
// so a key lands where every other producer of the topic puts it; a
// message without a key is placed by its event id the same way, and
// carries sequence headers like the others. The relay publishes each
// message to the partition equal to its shard ([PinningPublisher];
// KafkaPublisher does it through the writer's [Balancer], NewKafkaWriter's,
// and franzgo.Publisher through its franz-go partitioner)
// and adds the partitions header, inbox_partitions or ce_inboxpartitions,
// with the count. A consumer can then check that a message's partition is
// its shard and the count its topic's, and take a number above the last
// one applied plus one for a lost or reordered message.
//
// The store's shard count (storage.Sharded: OutboxOptions.Shards with this
// library's adapters) must equal the topic's partition count, and the
// partition count may not change. Before each publish the relay reads it
// (KafkaPublisher from the writer's metadata cache, which kafka-go
// refreshes every Transport.MetadataTTL, 6s by default; franzgo.Publisher
// from the cluster, at most once a second, asked while the claim runs when
// the cycle before found rows, so that a stream of commits does not wait
// for both one after the other). A relay whose Run starts while it
// differs from the shards returns a [*PartitionCountError]
// ([ErrPartitionCount]) at once, naming both counts; if it changes while
// the relay runs, every cycle fails with that error, logged at Error:
// nothing is published or marked, no message goes to another partition,
// and every cycle tries again. Kafka cannot remove
// partitions: after an increase, recreate the topic with the old count, or
// drain the outbox and move to a new outbox table with as many shards as
// the topic has now. Every Outbox over the table must be aligned to the
// same topic; the relay refuses, as [ErrShardStuck], a row that was stored
// for another topic or in a shard other than its key's partition (by an
// outbox in the other mode). Switch a table's mode only when it holds no
// unpublished rows.
//
// The price is contention: the shards are as many as the partitions, often
// far fewer than the default 64, and enqueuing transactions whose keys
// share a shard take turns. On a shared 2-core machine, 8 goroutines
// enqueuing one message per transaction into 8 shards ran at 0.83x the
// default's rate on PostgreSQL and 0.94x on MariaDB; with 10 messages of
// random keys per transaction they ran as fast as the default, whose
// transactions already take turns at that size (docs/BENCHMARKS.md,
// "Aligned shards").
//
// # A producer database that goes back
//
// A restore from a backup or a snapshot, point-in-time recovery, a
// failover to a replica that lacked the last commits, or a copy of the
// database with a relay of its own brings back older counters: numbers
// already published are handed out again, to other events, and a consumer
// deduplicating by watermark would skip those events as duplicates. The
// database cannot witness this itself (its counters, marks, source and
// epoch go back with it); an aligned outbox's partitions can, since each
// holds all the numbers of one shard. So the relay of an aligned outbox
// stamping sequence headers reads each shard's partition back before it
// publishes there (its publisher is a [Witness], as KafkaPublisher is; its
// store a storage.MarkReader, as this library's are):
//
//   - What it reads: from the offset stored with the shard's mark (each
//     mark stores the partition's end before the publish that reached it)
//     to the end, once when it first publishes a shard, and again whenever
//     the shard's mark, the source or the epoch in the database went back,
//     or the mark moved on without this relay (another relay held the
//     shard's lease meanwhile, and may have died between a publish and its
//     acknowledgement);
//     and, after each publish, whatever another writer (another relay,
//     another database) appended since its last look. Otherwise a cycle
//     costs nothing more than its publish: the broker's answer to the write
//     gives each message's offset (PinningPublisher.PublishPinned writes it
//     into the message; NewKafkaWriter's writer learns it through its
//     Completion, franzgo.Publisher from franz-go's records), and when a
//     partition's messages took the offsets right after what the relay
//     read, one after the other, nobody else appended before them. Any
//     other partition costs one request, for its end offset after the
//     publish; so does every cycle on a publisher that does not report
//     the offsets.
//   - The relay reads the partition as a consumer deduplicating by
//     watermark does: per epoch of the source, the first message of a
//     number is applied and any later one with that number is dropped as a
//     copy. A row whose event is such a first message was published before
//     (by a relay that died before marking it, or before the database went
//     back): it is marked published and not sent again, under any epoch.
//   - Any other row goes out under the epoch whose stream it continues (its
//     number is one past the stream's last): normally the database's epoch.
//     When no stream ends right before it, its number was already used for
//     another event, or lies past a hole: the database went back. The relay
//     raises the epoch past every epoch the partition shows
//     (storage.Sequenced.BumpEpoch) and publishes the row under it, a stream
//     no consumer has seen, which the following rows continue. It logs this
//     at Warn with the shard, the numbers and both epochs.
//   - After each publish it checks where its messages landed (above): if
//     another writer appended to a partition in between, it reads the end
//     offset and those messages too, and
//     a message of its own whose number the other writer took first is not
//     marked published; the next cycle sends it again under a new epoch.
//     Each mark stores the epoch of its row and the offset the next check
//     starts from. A consumer skips the losing copy (the first copy of a
//     number wins there too) and logs it at Error with both events (package
//     consumer, "Sequenced dedup").
//
// Nothing of this needs an operator; bump-epoch stays safe at any time. A
// relay that lives through a failover of its database needs nothing
// either: once its connections reach the promoted server (a DSN over the
// servers, such as PostgreSQL's target_session_attrs=read-write), it
// checks what it finds there as above.
// What it does not cover:
//
//   - An outbox that is not aligned: its shards span partitions and no
//     partition witnesses them, so consumers take such messages' inbox
//     rows (package consumer, "Sequenced dedup"; logged at Warn once per
//     source). After a restore its relay publishes again the rows the
//     backup held unpublished: copies, which the inbox rows drop.
//   - Messages that retention deleted: the read starts at the log start,
//     logged at Warn with both offsets; a database restored from before
//     the retained messages is checked against what is left only.
//   - A copy of the database (a staging clone) whose relay publishes to the
//     same topic as the original's is kept apart from it as above, each
//     collision costing a raise of the epoch (logged at Warn); consumers
//     then keep a watermark row per epoch. Give a clone an outbox table of
//     its own (a new source id) or another topic.
//
// Gap detection needs every message of a stream in the log: on a compacted
// topic (cleanup.policy=compact) compaction removes older messages of a
// key and leaves holes that are not losses, so such topics cannot use it;
// and a stream is contiguous only from the first offset that retention
// kept.
//
// # Several relays
//
// Relays lease shards in the database, with an expiry timed by the
// database's clock. On PostgreSQL (and MariaDB) the lease is taken with
// SELECT ... FOR UPDATE SKIP LOCKED, so relays never wait for each other and
// do no double work in the normal case; a relay that dies is replaced when
// its leases expire (RelayConfig.Lease), or at once if it restarts under the
// same RelayConfig.ID. An acknowledgement from a relay whose shard was taken
// over is refused ([storage.ErrLeaseLost]); what it published is published again by
// the new owner. So is one naming a row that the database no longer holds
// at that number (storage.Mark.EventID): restored from a backup under the
// relay, it hands the number out again, and a mark moved over it would
// leave the new event unpublished. On SQLite the leases work the same way, but every claim
// waits for the database's single write lock: one relay is enough there and
// a second one only stands by.
//
// A relay paused in the middle of a cycle (a GC pause, a frozen VM, SIGSTOP)
// is bounded by its lease: the cycle's publish runs under a deadline of 90%
// of RelayConfig.Lease after its claim, on the relay's monotonic clock, so a
// relay that resumes later publishes nothing of that cycle (the rows wait
// for the next claim, its own or another relay's), and the acknowledgement
// of a publish that did go out is refused if another relay took the shard
// over meanwhile (an expired lease nobody took is still its own). A publish
// already on
// the wire when the relay froze may still be appended after the lease
// expired, when another relay may have published the same rows: copies
// with the same event ids, which the downstream inbox drops, and since
// every run starts at the shard's mark the first copy of each message still
// follows the first copy of the one before it. A VM whose monotonic clock
// stops while it is frozen may publish a whole cycle late, with the same
// result: only copies.
//
// # Expiry
//
// Rows are filed under the UTC day they were enqueued on. On PostgreSQL and
// MariaDB each day is a partition, and Maintain drops a past day's partition
// whole, never by long DELETEs; on SQLite it deletes published rows in small
// batches. A day that still holds an unpublished row is never removed:
// Maintain keeps it, reports it in storage.MaintenanceReport.Held and logs an error
// each run until a relay has published it.
//
// # What adapters do
//
// The database-specific part is the small [storage.OutboxStore] interface, whose doc
// comments are the contract; the conformance package's outbox checks are its
// executable form. The Outbox and Relay own validation, retries, logging
// and metrics; adapters own their dialect SQL and reuse the inbox adapters'
// classification of transient errors.
package outbox
