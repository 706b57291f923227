package transport_test

import (
	"testing"

	"github.com/inboxgo/inbox/transport"
	"github.com/inboxgo/inbox/transport/franzgo"
)

func TestFranzGo(t *testing.T) {
	runContract(t, contract{
		cooperative: true,
		newClient: func(t *testing.T, brokers []string) transport.Client {
			c, err := franzgo.New(franzgo.Options{Brokers: brokers, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			return c
		},
	})
}

func TestFranzGoRefusesBadOptions(t *testing.T) {
	for _, o := range []franzgo.Options{
		{},
		{Brokers: []string{"no-port"}},
		{Brokers: []string{"127.0.0.1:9092"}, DialTimeout: -1},
	} {
		if _, err := franzgo.New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
	c, err := franzgo.New(franzgo.Options{Brokers: []string{"127.0.0.1:9092"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, cfg := range []transport.GroupConfig{
		{Topics: []string{"t"}, StartOffset: transport.FirstOffset},
		{GroupID: "g", StartOffset: transport.FirstOffset},
		{GroupID: "g", Topics: []string{"t"}, StartOffset: 5},
		{GroupID: "g", Topics: []string{"t"}, StartOffset: transport.FirstOffset, SessionTimeout: -1},
	} {
		if _, err := c.Group(cfg); err == nil {
			t.Errorf("Group(%+v) accepted", cfg)
		}
	}
}
