package consumer_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/inboxgo/inbox/dev/testtransport"
)

// TestMain refuses an unknown testtransport.Var before any test runs: a
// misspelt client name must not pass as a run on the default one.
func TestMain(m *testing.M) {
	if _, err := testtransport.Name(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}
