package consumer_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/internal/testhooks"
)

// heartbeatGate swallows the heartbeats of one member of a kfake cluster:
// they are answered as accepted without reaching the group. The member
// then believes it is alive while the coordinator sees a member that went
// silent, exactly as for a process paused past its session timeout (a GC
// pause, a frozen VM, SIGSTOP); unlike a real pause its workers can be
// resumed at a chosen moment, before the member learns that it is gone.
type heartbeatGate struct {
	mu       sync.Mutex
	clientID string // the member is the first of this client id seen while closed
	closed   bool
	member   string
}

func newHeartbeatGate(c *kfake.Cluster, clientID string) *heartbeatGate {
	g := &heartbeatGate{clientID: clientID}
	c.ControlKey(int16(kmsg.Heartbeat), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.HeartbeatRequest)
		if !g.swallows(req.MemberID) {
			return nil, nil, false
		}
		return req.ResponseKind(), nil, true
	})
	return g
}

func (g *heartbeatGate) swallows(member string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed || !strings.HasPrefix(member, g.clientID+"-") {
		return false
	}
	if g.member == "" {
		g.member = member
	}
	return member == g.member
}

func (g *heartbeatGate) close() { g.mu.Lock(); g.closed = true; g.mu.Unlock() }
func (g *heartbeatGate) open()  { g.mu.Lock(); g.closed = false; g.mu.Unlock() }

// offsetWatch polls a partition's stored offset and remembers whether it
// ever went down.
type offsetWatch struct {
	mu        sync.Mutex
	max, back int64 // the highest seen; the first value seen below an earlier one (-1: none)
	stop      chan struct{}
	done      chan struct{}
}

func watchStoredOffset(t *testing.T, s *shop, st groupOffsets, topic string, partition int) *offsetWatch {
	w := &offsetWatch{max: -1, back: -1, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			if next, err := st.Load(context.Background(), s.db, topic, partition); err == nil {
				w.mu.Lock()
				if next < w.max && w.back < 0 {
					w.back = next
					t.Logf("the stored offset went back from %d to %d", w.max, next)
				}
				w.max = max(w.max, next)
				w.mu.Unlock()
			}
			select {
			case <-w.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(w.end)
	return w
}

func (w *offsetWatch) end() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// lostItsPartition reports whether a member resumed past its session
// timeout said that it lost its partition, one of two ways: the consumer's
// stored-offset check found a newer generation's row ("taken over", whose
// attributes it returns), or the group coordinator refused the member's
// offset commit first and the client ended the partition's function
// before the worker wrote again (franz-go's transport says "fenced out of
// the group"). Either way the member stops without moving anything back,
// which the callers check apart.
func lostItsPartition(rec *recorder) (takenOver map[string]slog.Value, lost bool) {
	if attrs, ok := rec.find(slog.LevelWarn, "taken over"); ok {
		return attrs, true
	}
	_, fenced := rec.find(slog.LevelWarn, "fenced out of the group")
	return nil, fenced
}

// wentBack returns the first value below an earlier one, or -1.
func (w *offsetWatch) wentBack() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.back
}

// errorMessages returns the messages of the records at Error or above.
func (r *recorder) errorMessages() []string {
	var out []string
	for _, rec := range r.errorRecords() {
		out = append(out, rec.Message)
	}
	return out
}

// A member paused past its session timeout loses its partition; another
// member takes it over from the stored offset and moves it on. When the
// paused member resumes, before it learns that its generation is over, its
// next write of the stored offset must not move the offset back (before,
// the write was checked only against the member's own last write: the
// stored offset went back, the owner found its position "moved", logged an
// error, and redelivered everything in between). The zombie finds out that
// it lost the partition and stops its worker; the owner sees nothing of it.
func TestZombieMemberCannotMoveTheStoredOffsetBack(t *testing.T) {
	t.Parallel()
	for name, open := range shopsOnEachDatabase {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testZombieMember(t, name, open(t))
		})
	}
}

// shopsOnEachDatabase open a shop on SQLite and on the test servers (which
// skip without them).
var shopsOnEachDatabase = map[string]func(t *testing.T) *shop{
	"sqlite":   newSQLiteShop,
	"postgres": newPostgresShop,
	"mysql":    newMySQLShop,
}

func testZombieMember(t *testing.T, name string, s *shop) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	gate := newHeartbeatGate(cluster, "zombie")
	brokers := cluster.ListenAddrs()
	sendOrders(t, brokers, "orders", 1, 10, nil)
	table := "inbox_offsets" + s.suffix
	st := groupOffsets{Table: table, Group: "inventory"}

	// The member to be paused processes orders 0-5; after the database
	// commit of order 5 its worker stops (AfterDB runs before the message
	// is marked done: next is still 5), and from then on its heartbeats no
	// longer reach the coordinator.
	// Each member logs (the consumer's lines and its inbox's) to a
	// recorder of its own.
	zev, zrec := newEvents(), newRecorder(t)
	zcfg := baseConfig(t, brokers, "orders", "inventory", memberPool(t, name, s, slog.New(zrec), false), zev)
	zcfg.Offsets.Store, zcfg.Offsets.Table = true, table
	zcfg.Kafka.SessionTimeout, zcfg.Kafka.HeartbeatInterval = 2*time.Second, 200*time.Millisecond
	zcfg.Kafka.Dialer = &kafka.Dialer{ClientID: "zombie", Timeout: 10 * time.Second, DualStack: true}
	zcfg.Logger = slog.New(zrec)
	paused, resume := make(chan struct{}), make(chan struct{})
	var pausedOnce atomic.Bool
	var resumeOnce sync.Once
	resumeZombie := func() { resumeOnce.Do(func() { close(resume) }) }
	z := startWith(t, zcfg, &testhooks.Knobs{AfterDB: func(_ string, _ int, next int64, _ int) error {
		if next == 5 && pausedOnce.CompareAndSwap(false, true) {
			gate.close()
			close(paused)
			<-resume
		}
		return nil
	}})
	t.Cleanup(resumeZombie) // before z's Close, which waits for its worker
	select {
	case <-paused:
	case <-time.After(30 * time.Second):
		t.Fatal("the member did not process orders 0-5")
	}
	watch := watchStoredOffset(t, s, st, "orders", 0)
	waitMemberDropped(t, cluster, "inventory", "zombie-", "the paused member")

	// Another member takes the partition over and processes orders 6-9.
	oev, orec := newEvents(), newRecorder(t)
	ocfg := baseConfig(t, brokers, "orders", "inventory", memberPool(t, name, s, slog.New(orec), false), oev)
	ocfg.Offsets.Store, ocfg.Offsets.Table = true, table
	ocfg.Logger = slog.New(orec)
	o := startWith(t, ocfg, &testhooks.Knobs{PosCheckInterval: 100 * time.Millisecond})
	waitUntil(t, 30*time.Second, "the new owner to process orders 6-9", func() bool {
		next, err := st.Load(context.Background(), s.db, "orders", 0)
		return err == nil && next == 10 && oev.count(hooks.Processed) == 4
	})

	// The paused member resumes, still believing it owns the partition.
	resumeZombie()
	waitUntil(t, 20*time.Second, "the resumed member to give the partition up (or move the stored offset back)", func() bool {
		_, gaveUp := lostItsPartition(zrec)
		return gaveUp || watch.wentBack() >= 0
	})
	time.Sleep(500 * time.Millisecond) // a write moving the offset back would show now
	gate.open()

	// Whoever owns the partition now processes what comes next.
	produce(t, brokers, "orders", orderMessage(10, 0), orderMessage(11, 0), orderMessage(12, 0))
	waitUntil(t, 30*time.Second, "orders 10-12", func() bool { return len(s.counts(t)) == 13 })
	waitUntil(t, 30*time.Second, "the stored offset 13", func() bool {
		next, err := st.Load(context.Background(), s.db, "orders", 0)
		return err == nil && next == 13
	})
	time.Sleep(300 * time.Millisecond) // a redelivery applied twice would show now
	watch.end()
	if err := z.stop(t); err != nil {
		t.Errorf("the resumed member's Run: %v", err)
	}
	if err := o.stop(t); err != nil {
		t.Errorf("the owner's Run: %v", err)
	}

	if back := watch.wentBack(); back >= 0 {
		t.Errorf("the stored offset went back to %d", back)
	}
	if errs := orec.errorMessages(); len(errs) > 0 {
		t.Errorf("the owner logged errors: %q", errs)
	}
	if errs := zrec.errorMessages(); len(errs) > 0 {
		t.Errorf("the resumed member logged errors: %q", errs)
	}
	if n := oev.count(hooks.Repositioned) + zev.count(hooks.Repositioned); n != 0 {
		t.Errorf("%d repositionings: a member took the zombie's write for a failover", n)
	}
	if attrs, ok := lostItsPartition(zrec); !ok {
		t.Error("the resumed member did not say that it lost the partition")
	} else if attrs == nil {
		t.Log("the resumed member learnt from the group coordinator that it lost the partition before its worker wrote again")
	} else if g := attrs["owner_generation"].Int64(); g <= attrs["member_generation"].Int64() {
		t.Errorf("taken over by generation %d, not newer than the member's own %v", g, attrs["member_generation"])
	}
	s.checkExactlyOnce(t, 13, nil)
}

// A group deleted and created again starts its generation ids again, below
// those its stored rows name. The new group's members must not take
// themselves for zombies: the group coordinator accepts their commits, so
// their generation is current, and they take the rows over (at Info).
func TestRecreatedGroupTakesItsStoredOffsetsOver(t *testing.T) {
	t.Parallel()
	brokers := newKfake(t, 1, "orders")
	s := newSQLiteShop(t)
	sendOrders(t, brokers, "orders", 1, 5, nil)
	ev := newEvents()
	cfg := baseConfig(t, brokers, "orders", "inventory", s, ev)
	cfg.Offsets.Store = true
	a := start(t, cfg)
	waitUntil(t, 30*time.Second, "orders 0-4", func() bool { return ev.count(hooks.Processed) == 5 })
	if err := a.stop(t); err != nil {
		t.Fatal(err)
	}
	st := a.offsets()
	row, _, err := st.Read(context.Background(), s.db, "orders", 0)
	if err != nil || row.Generation < 1 || row.Next != 5 {
		t.Fatalf("stored %+v (%v), want offset 5 with the group's generation", row, err)
	}
	// The group lived through many generations before it was deleted.
	if err := s.db.Exec(`UPDATE ` + st.Table + ` SET generation = 1000`).Error; err != nil {
		t.Fatal(err)
	}
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	if _, err := cl.DeleteGroups(context.Background(), &kafka.DeleteGroupsRequest{GroupIDs: []string{"inventory"}}); err != nil {
		t.Fatal(err)
	}

	produce(t, brokers, "orders", orderMessage(5, 0), orderMessage(6, 0))
	ev2, rec := newEvents(), newRecorder(t)
	cfg.Hooks, cfg.Logger = []hooks.Hook{hooks.EventFunc(ev2.on)}, slog.New(rec)
	b := start(t, cfg)
	waitUntil(t, 30*time.Second, "orders 5 and 6", func() bool { return ev2.count(hooks.Processed) == 2 })
	if err := b.stop(t); err != nil {
		t.Fatal(err)
	}
	row, _, err = st.Read(context.Background(), s.db, "orders", 0)
	if err != nil || row.Next != 7 || row.Generation >= 1000 {
		t.Errorf("stored %+v (%v), want offset 7 with the new group's generation", row, err)
	}
	if _, ok := rec.find(slog.LevelInfo, "group was recreated"); !ok {
		t.Error("no Info says that the rows of the group's earlier life were taken over")
	}
	if errs := rec.errorMessages(); len(errs) > 0 {
		t.Errorf("errors logged: %q", errs)
	}
	s.checkExactlyOnce(t, 7, nil)
}

// waitMemberDropped waits until the coordinator of cluster lists no member
// of group whose id starts with prefix.
func waitMemberDropped(t *testing.T, cluster *kfake.Cluster, group, prefix, who string) {
	t.Helper()
	waitUntil(t, 30*time.Second, "the coordinator to drop "+who, func() bool {
		gi := cluster.GroupInfo(group)
		if gi == nil {
			return false
		}
		for _, m := range gi.Members {
			if strings.HasPrefix(m.MemberID, prefix) {
				return false
			}
		}
		return true
	})
}
