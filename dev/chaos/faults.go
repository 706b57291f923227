package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/inboxgo/inbox/consumer"
	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/dev/testtransport"
	"github.com/inboxgo/inbox/header"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/backoff"
)

// FaultClass names a fault injected on a known set of messages by the fault
// phase (RunFaults).
type FaultClass string

// The fault classes. Every poison class must be dead-lettered within the
// consumer's MaxAttempts; the healthy and transient ones applied exactly
// once.
const (
	// Healthy messages carry no fault.
	Healthy FaultClass = "healthy"
	// PoisonEmpty has an empty value: json.Decoder reports io.EOF, an error
	// that a database driver also returns for a lost connection.
	PoisonEmpty FaultClass = "poison-empty"
	// PoisonTruncated has a truncated JSON value: io.ErrUnexpectedEOF.
	PoisonTruncated FaultClass = "poison-truncated"
	// NetPermanent makes the handler call a closed port on 127.0.0.1 over
	// net/http and return the *url.Error (a net.Error) as it is.
	NetPermanent FaultClass = "net-permanent"
	// NetRetryable is NetPermanent with the error marked inbox.Retryable.
	NetRetryable FaultClass = "net-permanent-retryable"
	// NetTransient fails like NetPermanent for the first calls of its
	// handler (FaultConfig.Transient of them, fewer than MaxAttempts) and
	// then succeeds.
	NetTransient FaultClass = "net-transient"
	// HandlerDeadline makes the handler's own context.WithTimeout expire
	// during a slow local HTTP call (the error wraps
	// context.DeadlineExceeded and is a net.Error with Timeout()).
	HandlerDeadline FaultClass = "handler-deadline"
	// DeferredConstraint writes a row that violates a DEFERRABLE INITIALLY
	// DEFERRED foreign key: the handler succeeds and the COMMIT fails
	// (PostgreSQL, SQLite; MariaDB has no deferred constraints).
	DeferredConstraint FaultClass = "deferred-constraint"
	// TopicRecreated is the configuration fault: the topic is deleted and
	// recreated while a consumer with StoreOffsets is stopped, so the stored
	// offsets lie beyond the new log's end.
	TopicRecreated FaultClass = "topic-recreated"
)

// handlerClasses are the classes of the handler-fault rounds, in report
// order.
var handlerClasses = []FaultClass{Healthy, PoisonEmpty, PoisonTruncated, NetPermanent, NetRetryable, NetTransient, HandlerDeadline, DeferredConstraint}

// poison reports whether messages of class must end on the dead-letter
// topic rather than be applied.
func (c FaultClass) poison() bool {
	switch c {
	case Healthy, NetTransient, TopicRecreated:
		return false
	}
	return true
}

// FaultConfig sizes the fault phase. The zero value gives the defaults.
type FaultConfig struct {
	Healthy     int     // healthy orders per round (default 200)
	PerClass    int     // messages of each fault class per round (default 4)
	DupRate     float64 // share of messages the producer sends twice (default 0)
	MaxAttempts int     // the consumer's MaxAttempts (default 3)
	Transient   int     // failing calls of a NetTransient message before it succeeds (default MaxAttempts-1)
	BatchSizes  []int   // one round of handler faults per batch size (default 1 and 4)
	Partitions  int     // partitions of the topics (default 3)
	// Budget bounds a round: a message neither applied nor dead-lettered by
	// then is reported as stuck (default 60 s).
	Budget time.Duration
	// StopBudget bounds the wait for the recreated topic's partitions to be
	// stopped (default 30 s).
	StopBudget time.Duration
	// Before and After are the messages per partition written before the
	// topic is recreated and after (After < Before, so the stored offsets
	// are beyond the new log end; defaults 10 and 3).
	Before, After int
}

func (f *FaultConfig) defaults() {
	if f.Healthy <= 0 {
		f.Healthy = 200
	}
	if f.PerClass <= 0 {
		f.PerClass = 4
	}
	if f.MaxAttempts <= 0 {
		f.MaxAttempts = 3
	}
	if f.Transient <= 0 || f.Transient >= f.MaxAttempts {
		f.Transient = max(f.MaxAttempts-1, 1)
	}
	if len(f.BatchSizes) == 0 {
		f.BatchSizes = []int{1, 4}
	}
	if f.Partitions <= 0 {
		f.Partitions = 3
	}
	if f.Budget <= 0 {
		f.Budget = time.Minute
	}
	if f.StopBudget <= 0 {
		f.StopBudget = 30 * time.Second
	}
	if f.Before <= 0 {
		f.Before = 10
	}
	if f.After <= 0 || f.After >= f.Before {
		f.After = max(min(3, f.Before-1), 1)
	}
}

// FaultRow is one line of the fault report: one class in one round.
type FaultRow struct {
	Dialect      string
	Batch        int
	Class        FaultClass
	Messages     int // distinct events of the class
	Sent         int // messages written, producer duplicates included
	Applied      int // events whose effect is in the ledger (once or more)
	DeadLettered int // distinct events found on the dead-letter topic
	MaxAttempts  int // highest dlq_attempts header seen (0: none)
	Unresolved   int // neither applied nor dead-lettered when the round ended
	Lost         int // unresolved although the group committed past them
	Doubled      int // applied more than once
	Problems     []string
}

// OK reports whether the class behaved as required.
func (r *FaultRow) OK() bool { return len(r.Problems) == 0 }

// FaultReport is the outcome of the fault phase on one database.
type FaultReport struct {
	Dialect  string
	Seed     uint64
	Rows     []*FaultRow
	Notes    []string // classes that do not apply here, and why
	Evidence []string // what the consumer did with messages that got stuck
	Wall     time.Duration
}

// OK reports whether every class behaved as required.
func (r *FaultReport) OK() bool {
	for _, row := range r.Rows {
		if !row.OK() {
			return false
		}
	}
	return true
}

// Problems lists every class's problems, prefixed with the round.
func (r *FaultReport) Problems() []string {
	var out []string
	for _, row := range r.Rows {
		for _, p := range row.Problems {
			out = append(out, fmt.Sprintf("batch %d, %s: %s", row.Batch, row.Class, p))
		}
	}
	return out
}

func (r *FaultReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "fault phase on %s (seed %d, %.1fs)\n", r.Dialect, r.Seed, r.Wall.Seconds())
	b.WriteString(FaultTable([]*FaultReport{r}))
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  NOTE: %s\n", n)
	}
	for _, e := range r.Evidence {
		fmt.Fprintf(&b, "  EVIDENCE: %s\n", e)
	}
	if ps := r.Problems(); len(ps) > 0 {
		fmt.Fprintf(&b, "  verification: FAILED:\n")
		for _, p := range ps {
			fmt.Fprintf(&b, "    - %s\n", p)
		}
	} else {
		b.WriteString("  verification: OK, healthy messages applied exactly once, poison dead-lettered within MaxAttempts, nothing lost\n")
	}
	return b.String()
}

// FaultTable is the markdown table of docs/RELIABILITY.md for fault reports.
func FaultTable(reps []*FaultReport) string {
	var b strings.Builder
	b.WriteString("| database | batch | fault class | messages | applied | dead-lettered | max attempts seen | unresolved | lost | applied twice | result |\n")
	b.WriteString("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range reps {
		for _, row := range r.Rows {
			result := "ok"
			if !row.OK() {
				result = "FAILED"
			}
			attempts := "-"
			if row.MaxAttempts > 0 {
				attempts = strconv.Itoa(row.MaxAttempts)
			}
			fmt.Fprintf(&b, "| %s | %d | %s | %d | %d | %d | %s | %d | %d | %d | %s |\n",
				row.Dialect, row.Batch, row.Class, row.Messages, row.Applied, row.DeadLettered, attempts, row.Unresolved, row.Lost, row.Doubled, result)
		}
	}
	return b.String()
}

// RunFaults runs the fault phase on cfg's database: for each batch size a
// round of handler faults (poison payloads, network errors, a handler's own
// deadline, deferred-constraint failures at COMMIT) with Failure.Policy
// DeadLetter, then the recreated-topic round with Offsets.Store. Each round
// is bounded by its budget: a stuck message is reported, never waited for
// past it. An error means the phase could not be carried out; failed checks
// are in the report.
func RunFaults(ctx context.Context, cfg Config, fc FaultConfig) (*FaultReport, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	fc.defaults()
	start := time.Now()
	rep := &FaultReport{Dialect: cfg.Dialect, Seed: cfg.Seed}
	defer func() { rep.Wall = time.Since(start) }()
	if cfg.Dialect == "mysql" {
		rep.Notes = append(rep.Notes, "MariaDB has no deferred constraints (every constraint is checked at the statement): the deferred-constraint class does not exist there")
	}
	srv := newFaultServers()
	defer srv.close()
	for i, batch := range fc.BatchSizes {
		rr := &faultRound{cfg: cfg, fc: fc, batch: batch, srv: srv, rep: rep,
			rng: rand.New(rand.NewPCG(cfg.Seed, uint64(i)+1000))}
		if err := rr.run(ctx); err != nil {
			return rep, fmt.Errorf("fault round with batches of %d: %w", batch, err)
		}
	}
	rr := &faultRound{cfg: cfg, fc: fc, batch: 1, srv: srv, rep: rep, rng: rand.New(rand.NewPCG(cfg.Seed, 999))}
	if err := rr.recreate(ctx); err != nil {
		return rep, fmt.Errorf("recreated-topic round: %w", err)
	}
	return rep, nil
}

// faultServers are the handler's network peers: a port on 127.0.0.1 where
// nothing listens (connection refused), a server that answers at once, and
// one that answers only after the handler's deadline.
type faultServers struct {
	closedURL string
	ok, slow  *httptest.Server
	client    *http.Client
}

func newFaultServers() *faultServers {
	s := &faultServers{}
	// A port that was just free: nothing listens there once the listener is
	// closed (connection refused).
	if l, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		s.closedURL = "http://" + l.Addr().String() + "/reserve"
		_ = l.Close()
	} else {
		s.closedURL = "http://127.0.0.1:1/reserve"
	}
	s.ok = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	s.slow = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
		w.WriteHeader(http.StatusOK)
	}))
	// No connection reuse: each call dials, as a handler's first call after
	// an idle period does.
	s.client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	return s
}

func (s *faultServers) close() {
	s.ok.CloseClientConnections()
	s.slow.CloseClientConnections()
	s.ok.Close()
	s.slow.Close()
}

// call makes one GET request and fails on any error or a status other than
// 200.
func (s *faultServers) call(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// missingSKU is the stock row a deferred-constraint message refers to; it
// does not exist, so the deferred foreign key fails at COMMIT.
const missingSKU = "sku-missing"

// faultRound is one round of the fault phase: its own tables, topics and
// group on cfg's database.
type faultRound struct {
	cfg   Config
	fc    FaultConfig
	batch int
	srv   *faultServers
	rep   *FaultReport
	rng   *rand.Rand

	backend inventory.Backend
	db      *gorm.DB
	ib      *inbox.Inbox
	topic   string
	dlq     string
	group   string
	holds   bool         // the deferred-constraint table exists (not on MariaDB)
	log     *slog.Logger // the inbox's and the consumer's, to a file of the round

	parts   int                   // partitions of the round's topic
	classOf map[string]FaultClass // event id -> class
	sent    map[FaultClass]int    // messages written per class, duplicates included
	partOf  map[string]int        // event id -> partition
	qty     map[string]int64      // event id -> quantity ordered

	mu        sync.Mutex
	calls     map[string]int // handler calls by event id (NetTransient)
	batchRetr int            // whole batches retried
	batchErr  string         // the last batch retry's error
	msgRetr   map[FaultClass]*retryStats
}

type retryStats struct {
	n, maxAttempt int
	lastErr       string
}

func (rr *faultRound) say(format string, args ...any) {
	fmt.Fprintf(rr.cfg.Log, "faults %s %s batch %d: %s\n", time.Now().UTC().Format("15:04:05.0"), rr.cfg.Dialect, rr.batch, fmt.Sprintf(format, args...))
}

// setup creates the round's tables and topics; the returned cleanup drops
// them again.
func (rr *faultRound) setup(ctx context.Context, dlq bool) (cleanup func(), err error) {
	runID := fmt.Sprintf("%08x", rand.Uint32())
	rr.backend = backendFor(rr.cfg, runID)
	rr.topic, rr.dlq, rr.group = "faults-"+runID, "faults-"+runID+"-dlq", "faults-inventory-"+runID
	rr.classOf, rr.partOf, rr.qty, rr.calls, rr.msgRetr = map[string]FaultClass{}, map[string]int{}, map[string]int64{}, map[string]int{}, map[FaultClass]*retryStats{}
	db, store, err := rr.backend.Open()
	if err != nil {
		return nil, err
	}
	rr.db = db
	var undo []func()
	cleanup = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	undo = append(undo, func() { closeDB(db) })
	logFile, err := os.OpenFile(filepath.Join(rr.cfg.WorkDir, "faults-"+runID+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		cleanup()
		return nil, err
	}
	undo = append(undo, func() { logFile.Close() })
	rr.log = slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelWarn}))
	log := rr.log
	// Short inbox retries: a fault the inbox retries (a transient
	// classification) must not hide how the consumer counts attempts.
	rr.ib, err = inbox.New(db, store, inbox.Config{Logger: log, MaxAttempts: 3, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	if err != nil {
		cleanup()
		return nil, err
	}
	if err := rr.ib.Migrate(ctx); err != nil {
		cleanup()
		return nil, err
	}
	if _, err := rr.ib.Maintain(ctx); err != nil {
		cleanup()
		return nil, err
	}
	undo = append(undo, func() { rr.backend.DropTables(ctx, db) })
	if err := rr.backend.CreateTables(ctx, db, inventory.SKUs); err != nil {
		cleanup()
		return nil, err
	}
	if err := rr.createHolds(ctx); err != nil {
		cleanup()
		return nil, err
	}
	if rr.holds {
		// Before the stock table it refers to.
		undo = append(undo, func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_ = db.WithContext(dctx).Migrator().DropTable(rr.holdsTable())
		})
	}
	topics := []string{rr.topic}
	if dlq {
		topics = append(topics, rr.dlq)
	}
	for _, t := range topics {
		parts := rr.parts
		if t == rr.dlq {
			parts = 1
		}
		if err := inventory.CreateTopic(ctx, rr.cfg.Brokers[0], t, parts); err != nil {
			cleanup()
			return nil, err
		}
		undo = append(undo, func() { deleteTopic(rr.cfg.Brokers, t) })
	}
	return cleanup, nil
}

func (rr *faultRound) holdsTable() string { return "inv_holds_" + rr.backend.RunID }

// createHolds creates the table of stock holds, whose foreign key to the
// stock table is checked only at COMMIT. MariaDB has no deferred
// constraints, so there is none there.
func (rr *faultRound) createHolds(ctx context.Context) error {
	var ddl string
	switch rr.cfg.Dialect {
	case "postgres":
		ddl = `CREATE TABLE %s (id BIGSERIAL PRIMARY KEY, order_id VARCHAR(64) NOT NULL,
			sku VARCHAR(32) NOT NULL REFERENCES %s (sku) DEFERRABLE INITIALLY DEFERRED)`
	case "sqlite":
		// The adapter's DSN turns foreign keys on (they are off by default).
		ddl = `CREATE TABLE %s (id INTEGER PRIMARY KEY AUTOINCREMENT, order_id TEXT NOT NULL,
			sku TEXT NOT NULL REFERENCES %s (sku) DEFERRABLE INITIALLY DEFERRED)`
	default:
		return nil
	}
	if err := rr.db.WithContext(ctx).Exec(fmt.Sprintf(ddl, rr.holdsTable(), rr.backend.StockTable())).Error; err != nil {
		return fmt.Errorf("create the deferred-constraint table: %w", err)
	}
	rr.holds = true
	return nil
}

// handler is the inventory handler with the faults of each class injected
// after the effect was written, so that a failure must roll it back.
func (rr *faultRound) handler() consumer.Handler {
	return func(ctx context.Context, tx *gorm.DB, m consumer.Message) error {
		class := rr.classOf[m.EventID]
		var o inventory.Order
		// A Decoder, not json.Unmarshal: it reports io.EOF and
		// io.ErrUnexpectedEOF for empty and truncated input.
		if err := json.NewDecoder(bytes.NewReader(m.Value)).Decode(&o); err != nil {
			return fmt.Errorf("order %s: decode: %w", m.EventID, err)
		}
		if err := rr.backend.Reserve(ctx, tx, o); err != nil {
			return err
		}
		if rr.holds {
			sku := o.SKU
			if class == DeferredConstraint {
				sku = missingSKU
			}
			if err := tx.Exec("INSERT INTO "+rr.holdsTable()+" (order_id, sku) VALUES (?, ?)", o.OrderID, sku).Error; err != nil {
				return fmt.Errorf("order %s: hold: %w", o.OrderID, err)
			}
		}
		switch class {
		case NetPermanent:
			if err := rr.srv.call(ctx, rr.srv.closedURL); err != nil {
				return fmt.Errorf("order %s: notify the warehouse: %w", o.OrderID, err)
			}
			return fmt.Errorf("order %s: a closed port answered", o.OrderID)
		case NetRetryable:
			if err := rr.srv.call(ctx, rr.srv.closedURL); err != nil {
				return inbox.Retryable(fmt.Errorf("order %s: notify the warehouse: %w", o.OrderID, err))
			}
			return fmt.Errorf("order %s: a closed port answered", o.OrderID)
		case NetTransient:
			rr.mu.Lock()
			rr.calls[o.OrderID]++
			n := rr.calls[o.OrderID]
			rr.mu.Unlock()
			url := rr.srv.ok.URL
			if n <= rr.fc.Transient {
				url = rr.srv.closedURL
			}
			if err := rr.srv.call(ctx, url); err != nil {
				return fmt.Errorf("order %s: notify the warehouse (call %d): %w", o.OrderID, n, err)
			}
		case HandlerDeadline:
			hctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			if err := rr.srv.call(hctx, rr.srv.slow.URL); err != nil {
				return fmt.Errorf("order %s: price check: %w", o.OrderID, err)
			}
			return fmt.Errorf("order %s: the slow call returned before the deadline", o.OrderID)
		}
		return nil
	}
}

// onEvent keeps what the consumer reports about retries: the evidence of a
// message that is retried without its attempts being counted. A message's
// retry error names its event id.
func (rr *faultRound) onEvent(e hooks.Event) {
	if e.Kind != hooks.Retry {
		return
	}
	errText := ""
	if e.Err != nil {
		errText = e.Err.Error()
	}
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if e.Offset < 0 {
		rr.batchRetr++
		rr.batchErr = errText
		return
	}
	class := rr.classOf[eventIDIn(errText, rr.classOf)]
	st := rr.msgRetr[class]
	if st == nil {
		st = &retryStats{}
		rr.msgRetr[class] = st
	}
	st.n++
	st.maxAttempt = max(st.maxAttempt, e.Attempt)
	st.lastErr = errText
}

// eventIDIn finds an event id of ids quoted in an error text.
func eventIDIn(text string, ids map[string]FaultClass) string {
	i := strings.Index(text, "order-")
	if i < 0 {
		return ""
	}
	end := i
	for end < len(text) && (text[end] == '-' || text[end] == '_' || (text[end] >= '0' && text[end] <= '9') || (text[end] >= 'a' && text[end] <= 'z')) {
		end++
	}
	if _, ok := ids[text[i:end]]; ok {
		return text[i:end]
	}
	return ""
}

// classes are the classes of a handler round on this database: the
// deferred constraint does not exist on MariaDB.
func (rr *faultRound) classes() []FaultClass {
	if rr.cfg.Dialect == "mysql" {
		return slices.DeleteFunc(slices.Clone(handlerClasses), func(c FaultClass) bool { return c == DeferredConstraint })
	}
	return handlerClasses
}

// generate makes the round's orders: Healthy healthy ones and PerClass of
// each fault class, DupRate of them sent twice. Each fault class has a
// partition of its own, shared with healthy messages (partition 0 has only
// healthy ones), so that a message the consumer gets stuck on holds up only
// its own class and the healthy messages behind it: every class is judged
// on its own, and faults share batches with healthy messages.
func (rr *faultRound) generate() []kafka.Message {
	base := time.Now().UTC().Add(-time.Hour)
	var msgs []kafka.Message
	n := 0
	for p, class := range rr.classes() {
		count := rr.fc.PerClass
		if class == Healthy {
			count = rr.fc.Healthy
		}
		for i := range count {
			part := p
			if class == Healthy {
				part = i % rr.parts
			}
			o := inventory.Order{OrderID: fmt.Sprintf("order-%s-%s-%04d", rr.backend.RunID, class, i),
				SKU: rr.skuOf(part), Qty: 1 + rr.rng.Int64N(5)}
			m := inventory.Message(o, base.Add(time.Duration(n)*time.Millisecond))
			n++
			switch class {
			case PoisonEmpty:
				m.Value = []byte{}
			case PoisonTruncated:
				m.Value = m.Value[:len(m.Value)/2]
			}
			rr.classOf[o.OrderID] = class
			rr.qty[o.OrderID] = o.Qty
			rr.partOf[o.OrderID] = part
			msgs = append(msgs, m)
		}
	}
	rr.rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	for i := range len(msgs) {
		if rr.rng.Float64() < rr.fc.DupRate {
			msgs = append(msgs, msgs[i])
		}
	}
	return msgs
}

// skuOf picks a SKU of partition p's own: the partitions' orders touch
// disjoint stock rows. Batches of orders on shared hot rows deadlock on
// PostgreSQL (docs/RELIABILITY.md, finding 3), which the chaos phase covers;
// here they would only slow the faults down.
func (rr *faultRound) skuOf(p int) string {
	var own []string
	for i := p % len(inventory.SKUs); i < len(inventory.SKUs); i += rr.parts {
		own = append(own, inventory.SKUs[i])
	}
	if len(own) == 0 {
		return inventory.SKUs[rr.rng.IntN(len(inventory.SKUs))]
	}
	return own[rr.rng.IntN(len(own))]
}

// partitionOf is the balancer of a handler round: each message goes to the
// partition generate chose for it.
func (rr *faultRound) partitionOf(m kafka.Message, partitions ...int) int {
	if p, ok := rr.partOf[string(m.Key)]; ok && p < len(partitions) {
		return partitions[p]
	}
	return partitions[0]
}

// consumerConfig is the consumer of the fault phase: dead letters, a small
// MaxAttempts and short backoffs.
func (rr *faultRound) consumerConfig(onEvent func(hooks.Event)) consumer.Config {
	session := rr.cfg.Session
	return consumer.Config{
		Brokers: rr.cfg.Brokers, GroupID: rr.group, Topics: []string{rr.topic},
		Inbox: rr.ib, Consumer: "inventory", Handler: rr.handler(),
		BatchSize: rr.batch, BatchWait: 20 * time.Millisecond,
		Failure: consumer.FailureConfig{
			MaxAttempts:     rr.fc.MaxAttempts,
			MinBackoff:      10 * time.Millisecond,
			MaxBackoff:      100 * time.Millisecond,
			Policy:          consumer.DeadLetter,
			DeadLetterTopic: rr.dlq,
		},
		Kafka: consumer.KafkaConfig{
			CommitInterval:    200 * time.Millisecond,
			MaxWait:           200 * time.Millisecond,
			SessionTimeout:    session,
			HeartbeatInterval: session / 4,
			RebalanceTimeout:  2 * session,
		},
		Logger: rr.log, Hooks: []hooks.Hook{hooks.EventFunc(onEvent)},
	}
}

// startConsumer runs a consumer in this process until the returned stop is
// called; stop waits at most 30 s for it.
func (rr *faultRound) startConsumer(ctx context.Context, cfg consumer.Config) (*consumer.Consumer, func() error, error) {
	if err := testtransport.Apply(&cfg); err != nil {
		return nil, nil, err
	}
	c, err := consumer.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	if err := c.Migrate(ctx); err != nil {
		return nil, nil, err
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var stopErr error
	stop := func() error {
		once.Do(func() {
			select {
			case err := <-done:
				// Run returned on its own (a configuration the group rejected).
				stopErr = fmt.Errorf("the consumer ended early: %w", err)
				return
			default:
			}
			closed := make(chan struct{})
			go func() { _ = c.Close(); close(closed) }()
			select {
			case <-closed:
			case <-time.After(30 * time.Second):
				stopErr = errors.New("the consumer did not stop within 30 s")
				return
			}
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, consumer.ErrPartitionStopped) {
				stopErr = err
			}
		})
		return stopErr
	}
	return c, stop, nil
}

// run is one round of handler faults.
func (rr *faultRound) run(ctx context.Context) error {
	rr.parts = len(rr.classes())
	cleanup, err := rr.setup(ctx, true)
	if err != nil {
		return err
	}
	defer cleanup()
	msgs := rr.generate()
	sent := map[string]int{}
	rr.sent = map[FaultClass]int{}
	for _, m := range msgs {
		sent[string(m.Key)]++
		rr.sent[rr.classOf[string(m.Key)]]++
	}
	rr.say("%d messages (%d events) on %s, dead letters to %s", len(msgs), len(rr.classOf), rr.topic, rr.dlq)

	dlqs := newDLQReader(rr.cfg.Brokers, rr.dlq)
	dctx, stopDLQ := context.WithCancel(ctx)
	dlqDone := make(chan struct{})
	go func() { defer close(dlqDone); dlqs.run(dctx) }()
	defer func() { stopDLQ(); <-dlqDone }()

	_, stop, err := rr.startConsumer(ctx, rr.consumerConfig(rr.onEvent))
	if err != nil {
		return err
	}
	defer func() { _ = stop() }()

	w := inventory.Writer(rr.cfg.Brokers, rr.topic)
	w.Balancer = kafka.BalancerFunc(rr.partitionOf)
	defer w.Close()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = inventory.Write(wctx, w, msgs)
	cancel()
	if err != nil {
		return err
	}

	// Wait, within the budget, until every message is applied or
	// dead-lettered and the group committed to the end.
	deadline := time.Now().Add(rr.fc.Budget)
	var apps map[string]int64
	var done bool
	last := time.Now()
	for {
		a, err := rr.backend.Applications(ctx, rr.db)
		if err == nil {
			apps = a
		}
		resolved, total := rr.resolved(apps, dlqs.byEvent())
		if resolved == total {
			if p, err := inventory.GroupProgress(ctx, rr.cfg.Brokers, rr.group, rr.topic, rr.parts); err == nil && p.Done {
				done = true
				break
			}
		}
		if time.Now().After(deadline) {
			rr.say("budget of %v used up: %d of %d events resolved", rr.fc.Budget, resolved, total)
			break
		}
		if time.Since(last) > 5*time.Second {
			rr.say("%d of %d events applied or dead-lettered", resolved, total)
			last = time.Now()
		}
		if backoff.Sleep(ctx, 300*time.Millisecond) != nil {
			return ctx.Err()
		}
	}
	if err := stop(); err != nil {
		rr.say("stopping the consumer: %v", err)
	}
	// A last look after the consumer stopped: what it committed is final.
	if a, err := rr.backend.Applications(ctx, rr.db); err == nil {
		apps = a
	}
	_ = backoff.Sleep(ctx, 500*time.Millisecond) // the DLQ reader's last fetch
	o := outcome{apps: apps, deadLetters: dlqs.byEvent(), sent: sent, done: done}
	o.stockErr = rr.db.WithContext(ctx).Table(rr.backend.StockTable()).Select("COALESCE(SUM(reserved), 0)").Scan(&o.reserved).Error
	rr.judge(o)
	rr.evidence()
	return nil
}

// resolved counts the events applied (non-poison) or dead-lettered (poison).
func (rr *faultRound) resolved(apps map[string]int64, dl map[string][]deadLetterSeen) (int, int) {
	n := 0
	for id, class := range rr.classOf {
		if class.poison() && len(dl[id]) > 0 || !class.poison() && apps[id] > 0 {
			n++
		}
	}
	return n, len(rr.classOf)
}

// outcome is what a round left behind, as read back after it.
type outcome struct {
	apps        map[string]int64            // ledger rows by event id
	deadLetters map[string][]deadLetterSeen // dead letters by event id
	sent        map[string]int              // messages written by event id
	done        bool                        // the group committed to the end of the topic
	reserved    int64                       // stock reserved over all SKUs
	stockErr    error                       // reading reserved failed
}

// judge fills the round's rows of the report from its outcome.
func (rr *faultRound) judge(o outcome) {
	apps, dl, sent, done := o.apps, o.deadLetters, o.sent, o.done
	rows := map[FaultClass]*FaultRow{}
	var order []FaultClass
	for _, class := range rr.classes() {
		rows[class] = &FaultRow{Dialect: rr.cfg.Dialect, Batch: rr.batch, Class: class}
		order = append(order, class)
	}
	var wantStock int64
	ids := make([]string, 0, len(rr.classOf))
	for id := range rr.classOf {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		class := rr.classOf[id]
		row := rows[class]
		row.Messages++
		row.Sent += sent[id]
		n, seen := apps[id], dl[id]
		if n > 0 {
			row.Applied++
		}
		if n > 1 {
			row.Doubled++
			row.Problems = append(row.Problems, fmt.Sprintf("%s applied %d times", id, n))
		}
		if len(seen) > 0 {
			row.DeadLettered++
		}
		for _, s := range seen {
			row.MaxAttempts = max(row.MaxAttempts, s.attempts)
		}
		if !class.poison() {
			wantStock += rr.qty[id]
			if len(seen) > 0 {
				row.Problems = append(row.Problems, fmt.Sprintf("%s (not poison) dead-lettered: %s", id, seen[0]))
			}
			if n == 0 {
				rr.unresolved(row, id, done)
			}
			continue
		}
		if n > 0 {
			row.Problems = append(row.Problems, fmt.Sprintf("poison %s was applied", id))
		}
		if len(seen) == 0 {
			rr.unresolved(row, id, done)
		}
		for _, s := range seen {
			if s.attempts < 1 || s.attempts > rr.fc.MaxAttempts {
				row.Problems = append(row.Problems, fmt.Sprintf("%s dead-lettered after %d attempts, MaxAttempts is %d", id, s.attempts, rr.fc.MaxAttempts))
			}
			if want := expectedReason(class); s.reason != want {
				row.Problems = append(row.Problems, fmt.Sprintf("%s dead-lettered with reason %q, want %q", id, s.reason, want))
			}
		}
	}
	if o.stockErr != nil {
		rows[Healthy].Problems = append(rows[Healthy].Problems, fmt.Sprintf("read the stock: %v", o.stockErr))
	} else if done && o.reserved != wantStock {
		rows[Healthy].Problems = append(rows[Healthy].Problems, fmt.Sprintf("stock reserved %d, want %d (the healthy and transient orders)", o.reserved, wantStock))
	}
	for _, class := range order {
		row := rows[class]
		if len(row.Problems) > 5 {
			row.Problems = append(row.Problems[:5], fmt.Sprintf("... and %d more", len(row.Problems)-5))
		}
		rr.rep.Rows = append(rr.rep.Rows, row)
	}
}

// unresolved records an event neither applied nor dead-lettered: lost if
// the group committed past it, stuck otherwise.
func (rr *faultRound) unresolved(row *FaultRow, id string, done bool) {
	row.Unresolved++
	if done {
		row.Lost++
		row.Problems = append(row.Problems, fmt.Sprintf("%s lost: neither applied nor dead-lettered, and the group committed past it", id))
		return
	}
	behind := ""
	if p := rr.partOf[id]; rr.classOf[id] == Healthy && p > 0 && p < len(rr.classes()) {
		behind = fmt.Sprintf(", behind the %s messages of its partition", rr.classes()[p])
	}
	row.Problems = append(row.Problems, fmt.Sprintf("%s neither applied nor dead-lettered within %v (stuck%s)", id, rr.fc.Budget, behind))
}

// evidence describes how the consumer retried, for the classes that got
// stuck: retries without their attempts counted, or whole batches retried.
func (rr *faultRound) evidence() {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.batchRetr > 0 {
		rr.rep.Evidence = append(rr.rep.Evidence, fmt.Sprintf("batch %d: %d whole-batch retries (retried without limit as a database failure); last error: %s",
			rr.batch, rr.batchRetr, shorten(rr.batchErr, 300)))
	}
	for _, class := range handlerClasses {
		st := rr.msgRetr[class]
		// A message is retried at most MaxAttempts-1 times per delivery
		// (producer duplicates are deliveries of their own).
		if st == nil || st.n <= (rr.fc.MaxAttempts-1)*rr.sent[class] {
			continue
		}
		rr.rep.Evidence = append(rr.rep.Evidence, fmt.Sprintf("batch %d, %s: %d message retries, highest attempt %d of MaxAttempts %d (not counted as attempts); last error: %s",
			rr.batch, class, st.n, st.maxAttempt, rr.fc.MaxAttempts, shorten(st.lastErr, 300)))
	}
}

func shorten(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// expectedReason is the dlq_reason a poison message of class must carry.
func expectedReason(FaultClass) string { return consumer.ReasonHandlerError }

// deadLetterSeen is one dead letter read back from the dead-letter topic.
type deadLetterSeen struct {
	attempts int
	reason   string
	err      string
}

func (d deadLetterSeen) String() string {
	return fmt.Sprintf("reason %s after %d attempts: %s", d.reason, d.attempts, shorten(d.err, 200))
}

// dlqReader reads a dead-letter topic (one partition) from its start for
// as long as it runs.
type dlqReader struct {
	brokers []string
	topic   string
	mu      sync.Mutex
	seen    map[string][]deadLetterSeen
}

func newDLQReader(brokers []string, topic string) *dlqReader {
	return &dlqReader{brokers: brokers, topic: topic, seen: map[string][]deadLetterSeen{}}
}

func (d *dlqReader) run(ctx context.Context) {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: d.brokers, Topic: d.topic, Partition: 0, MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 200 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(kafka.FirstOffset); err != nil {
		return
	}
	for ctx.Err() == nil {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			_ = backoff.Sleep(ctx, 100*time.Millisecond)
			continue
		}
		var id string
		var s deadLetterSeen
		for _, h := range m.Headers {
			switch h.Key {
			case header.DLQEventID:
				id = string(h.Value)
			case header.DLQAttempts:
				s.attempts, _ = strconv.Atoi(string(h.Value))
			case header.DLQReason:
				s.reason = string(h.Value)
			case header.DLQError:
				s.err = string(h.Value)
			}
		}
		if id == "" {
			id = string(m.Key) // the order id is also the key
		}
		d.mu.Lock()
		d.seen[id] = append(d.seen[id], s)
		d.mu.Unlock()
	}
}

// byEvent returns the dead letters read so far, by event id.
func (d *dlqReader) byEvent() map[string][]deadLetterSeen {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string][]deadLetterSeen, len(d.seen))
	for k, v := range d.seen {
		out[k] = slices.Clone(v)
	}
	return out
}

// deleteTopic deletes topics, best effort.
func deleteTopic(brokers []string, topics ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	_, _ = client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: topics})
}
