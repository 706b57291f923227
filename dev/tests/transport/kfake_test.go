package transport_test

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/inboxgo/inbox/transport"
	"github.com/inboxgo/inbox/transport/franzgo"
)

// TestFranzGoKfake runs the suite on the in-process broker too: no server
// needed, and a second implementation of the group protocol.
func TestFranzGoKfake(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	runContractOn(t, contract{
		cooperative: true,
		newClient: func(t *testing.T, brokers []string) transport.Client {
			cl, err := franzgo.New(franzgo.Options{Brokers: brokers, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			return cl
		},
	}, c.ListenAddrs())
}
