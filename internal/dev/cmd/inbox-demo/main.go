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

	"github.com/inboxgo/inbox/internal/dev/inventory"
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
