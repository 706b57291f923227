// Command inbox-demo runs the inventory scenario of the transactional inbox
// from end to end and checks the result.
//
// An inventory consumer reserves stock on each OrderCreated event. The demo
// produces orders (some sent twice by the producer), consumes them through
// the inbox in separate consumer processes, kills one with SIGKILL
// mid-stream, starts two more in the same group so the partitions are
// rebalanced, replays the whole topic with a new consumer group, and then
// verifies that every order was reserved exactly once.
//
// Then the outbox chain: service A places orders and enqueues OrderCreated
// in each order's transaction, a relay publishes them, service B reserves
// stock, deduplicating by the sequence the relay stamped (a watermark per
// stream, no inbox row), and enqueues StockReserved in the same
// transaction, a second relay publishes those, and a ledger books them
// through its inbox rows. The first relay kills itself between the broker's
// acknowledgement and marking a batch published, B's consumer is killed
// mid-stream; the demo then checks that every order was reserved once,
// every StockReserved published at least once and booked once, and nothing
// was applied out of its key's order.
//
// Each figure of the report says where it comes from (a duplicate is a
// producer's second copy, a copy a relay published again, or a message
// Kafka delivered again after a kill or a hand-over), and beside the
// exactly-once result stands what the same deliveries would have applied
// without the inbox.
//
// By default it needs nothing installed: SQLite in a temporary directory and
// an in-process Kafka broker (franz-go's kfake). Point it at real servers with
// -db postgres|mysql -dsn DSN and -brokers host:port.
//
// Usage:
//
//	go run ./cmd/inbox-demo [-orders 2000] [-dup 0.1] [-db sqlite] [-dsn DSN] [-brokers host:port] [-keep]
//
// It exits 0 when the verification holds, 1 when it does not or the run
// fails, 2 on a usage error.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/inboxgo/inbox/dev/inventory"
)

func main() {
	if ran, code := inventory.RunProcessFromEnv(os.Stderr); ran {
		os.Exit(code)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func usageError(stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "inbox-demo: "+format+"\n", args...)
	return 2
}
