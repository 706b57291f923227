package chaos

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/internal/backoff"
)

// killLeader kills a node of the Kafka cluster with SIGKILL: in turn the
// node of the group's coordinator and the leader of the partition with the
// most work left. It restarts the node after 1-4 s and waits until every
// partition of the topic has its full set of in-sync replicas again, so
// that at most one node is ever down (min.insync.replicas 2 of 3: acks=all
// writes go on meanwhile).
func (r *run) killLeader(ctx context.Context) error {
	r.waitBusy(ctx, 5*time.Second)
	node, role, err := r.pickNode(ctx, len(r.rep.LeaderKills)%2 == 0)
	if err != nil {
		// The cluster is electing or a lookup timed out: the next kill tries again.
		r.say("cannot find a node to kill: %v", err)
		return nil
	}
	dir := filepath.Join(r.cfg.KafkaDir, "node"+strconv.Itoa(node))
	r.say("SIGKILL Kafka node %d (%s)", node, role)
	if err := r.script(ctx, "kafka.sh", "kill", dir); err != nil {
		return err
	}
	killed := time.Now()
	if backoff.Sleep(ctx, time.Second+r.jitter(2*time.Second)) != nil {
		return ctx.Err()
	}
	if err := r.script(ctx, "kafka.sh", "restart", dir); err != nil {
		return err
	}
	k := LeaderKill{Node: node, Role: role, Back: time.Since(killed)}
	if err := r.waitFullISR(ctx, 2*time.Minute); err != nil {
		return err
	}
	k.FullISR = time.Since(killed)
	r.mu.Lock()
	r.rep.LeaderKills = append(r.rep.LeaderKills, k)
	n := len(r.rep.LeaderKills)
	r.mu.Unlock()
	r.say("Kafka node kill #%d: node %d back after %.1fs, every partition fully in sync after %.1fs", n, node, k.Back.Seconds(), k.FullISR.Seconds())
	return nil
}

// pickNode returns the node id of the group's coordinator, or of the
// leader of the partition of the topic with the most messages not yet
// committed by the group.
func (r *run) pickNode(ctx context.Context, coordinator bool) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(r.cfg.Brokers...), Timeout: 5 * time.Second}
	if coordinator {
		resp, err := client.FindCoordinator(ctx, &kafka.FindCoordinatorRequest{Key: r.group, KeyType: kafka.CoordinatorKeyTypeConsumer})
		if err != nil {
			return 0, "", err
		}
		if resp.Error != nil {
			return 0, "", resp.Error
		}
		return resp.Coordinator.NodeID, "coordinator of the group", nil
	}
	busiest, most := 0, int64(-1)
	if p, err := inventory.GroupProgress(ctx, r.cfg.Brokers, r.group, r.topic, r.cfg.Partitions); err == nil {
		for part, end := range p.Ends {
			if left := end - p.Offsets[part]; left > most {
				busiest, most = part, left
			}
		}
	}
	meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{r.topic}})
	if err != nil {
		return 0, "", err
	}
	for _, t := range meta.Topics {
		for _, p := range t.Partitions {
			if p.ID == busiest {
				if p.Leader.ID < 0 {
					return 0, "", fmt.Errorf("partition %d has no leader", busiest)
				}
				return p.Leader.ID, fmt.Sprintf("leader of partition %d, %d messages behind", busiest, most), nil
			}
		}
	}
	return 0, "", fmt.Errorf("partition %d not in the metadata", busiest)
}

// waitFullISR waits until every partition of the run's topics, and of the
// group offsets topic, has as many in-sync replicas as replicas.
func (r *run) waitFullISR(ctx context.Context, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(r.cfg.Brokers...), Timeout: 5 * time.Second}
	topics := []string{r.topic, "__consumer_offsets"}
	if r.dlq != "" {
		topics = append(topics, r.dlq)
	}
	var last error
	for {
		meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
		if err == nil {
			last = nil
			for _, t := range meta.Topics {
				for _, p := range t.Partitions {
					if len(p.Isr) < len(p.Replicas) || p.Leader.ID < 0 {
						last = fmt.Errorf("%s/%d: %d of %d replicas in sync", t.Name, p.ID, len(p.Isr), len(p.Replicas))
					}
				}
			}
			if last == nil {
				return nil
			}
		} else {
			last = err
		}
		if backoff.Sleep(ctx, 250*time.Millisecond) != nil {
			return errors.Join(fmt.Errorf("chaos: the cluster did not get every replica back in sync within %v", limit), last)
		}
	}
}
