// A Sarama client for logmq's test suite, built from Debian's Go packages
// (golang-github-shopify-sarama-dev 1.22.1) by tests/kafka/test_kafka_sarama.py.
//
// Every command prints JSON lines on stdout for the test to judge, and exits non-zero
// with the error on stderr when Sarama reports one it should not have.
//
//	sarama-client produce BOOTSTRAP TOPIC N
//	sarama-client produce-invalid BOOTSTRAP TOPIC
//	sarama-client group BOOTSTRAP GROUP TOPIC N
//	sarama-client admin BOOTSTRAP TOPIC
//	sarama-client consume BOOTSTRAP TOPIC PARTITION N
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/Shopify/sarama"
)

func config() *sarama.Config {
	c := sarama.NewConfig()
	// The newest Kafka version Sarama 1.22.1 knows: Produce v3, Fetch v4, Metadata v5,
	// CreateTopics v2; commits stay OffsetCommit v1 (no retention set), as Sarama does.
	c.Version = sarama.V2_2_0_0
	c.ClientID = "sarama-logmq-test"
	c.Metadata.Retry.Max = 10
	c.Metadata.Retry.Backoff = 200 * time.Millisecond
	return c
}

func emit(v interface{}) {
	out, _ := json.Marshal(v)
	fmt.Println(string(out))
}

func fail(what string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
	os.Exit(1)
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		fail("bad number", err)
	}
	return n
}

func produce(bootstrap, topic string, n int) {
	c := config()
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Return.Successes = true
	p, err := sarama.NewSyncProducer([]string{bootstrap}, c)
	if err != nil {
		fail("producer", err)
	}
	defer p.Close()
	for i := 0; i < n; i++ {
		part, off, err := p.SendMessage(&sarama.ProducerMessage{
			Topic: topic,
			Key:   sarama.StringEncoder(fmt.Sprintf("k%d", i)),
			Value: sarama.StringEncoder(fmt.Sprintf("v%d", i)),
		})
		if err != nil {
			fail("send", err)
		}
		emit(map[string]interface{}{"partition": part, "offset": off})
	}
}

// produceInvalid sends to a topic whose name Kafka refuses and reports the error Sarama got.
func produceInvalid(bootstrap, topic string) {
	c := config()
	c.Producer.Return.Successes = true
	c.Metadata.Retry.Max = 1
	c.Producer.Retry.Max = 1
	p, err := sarama.NewSyncProducer([]string{bootstrap}, c)
	if err != nil {
		fail("producer", err)
	}
	defer p.Close()
	_, _, err = p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder("x")})
	if err == nil {
		fail("send", fmt.Errorf("an invalid topic name was accepted"))
	}
	code := -1
	if perr, ok := err.(*sarama.ProducerError); ok {
		err = perr.Err
	}
	if kerr, ok := err.(sarama.KError); ok {
		code = int(kerr)
	}
	emit(map[string]interface{}{"error": err.Error(), "code": code})
}

type handler struct {
	mu     sync.Mutex
	want   int
	got    int
	done   chan struct{}
	closed bool
}

func (h *handler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *handler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		h.mu.Lock()
		if h.got < h.want {
			emit(map[string]interface{}{
				"partition": msg.Partition, "offset": msg.Offset, "value": string(msg.Value),
			})
			s.MarkMessage(msg, "")
			h.got++
		}
		if h.got >= h.want && !h.closed {
			h.closed = true
			close(h.done)
		}
		h.mu.Unlock()
	}
	return nil
}

// group reads n records as a member of a consumer group, marks them, and leaves: the
// offsets are committed (OffsetCommit v1) on the way out, so the next run resumes there.
func group(bootstrap, groupID, topic string, n int) {
	c := config()
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Offsets.CommitInterval = 200 * time.Millisecond
	c.Consumer.Return.Errors = true
	g, err := sarama.NewConsumerGroup([]string{bootstrap}, groupID, c)
	if err != nil {
		fail("group", err)
	}
	var errs []string
	var errMu sync.Mutex
	go func() {
		for err := range g.Errors() {
			errMu.Lock()
			errs = append(errs, err.Error())
			errMu.Unlock()
		}
	}()
	h := &handler{want: n, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	consumed := make(chan error, 1)
	go func() {
		for ctx.Err() == nil {
			if err := g.Consume(ctx, []string{topic}, h); err != nil {
				consumed <- err
				return
			}
		}
		consumed <- nil
	}()
	select {
	case <-h.done:
	case err := <-consumed:
		fail("consume", err)
	case <-time.After(60 * time.Second):
		fail("consume", fmt.Errorf("only %d of %d records in 60 s", h.got, n))
	}
	cancel()
	<-consumed
	if err := g.Close(); err != nil {
		fail("close", err)
	}
	errMu.Lock()
	defer errMu.Unlock()
	if len(errs) > 0 {
		fail("group errors", fmt.Errorf("%v", errs))
	}
}

// consume reads n records of one partition from the oldest offset (ListOffsets -2), no
// group: what a tiered partition serves from its remote tier first.
func consume(bootstrap, topic string, partition int32, n int) {
	c := config()
	c.Consumer.Return.Errors = true
	consumer, err := sarama.NewConsumer([]string{bootstrap}, c)
	if err != nil {
		fail("consumer", err)
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, partition, sarama.OffsetOldest)
	if err != nil {
		fail("consume partition", err)
	}
	defer pc.Close()
	timeout := time.After(60 * time.Second)
	for got := 0; got < n; {
		select {
		case msg := <-pc.Messages():
			emit(map[string]interface{}{"offset": msg.Offset, "value": string(msg.Value)})
			got++
		case err := <-pc.Errors():
			fail("consume", err)
		case <-timeout:
			fail("consume", fmt.Errorf("only %d of %d records in 60 s", got, n))
		}
	}
}

func admin(bootstrap, topic string) {
	a, err := sarama.NewClusterAdmin([]string{bootstrap}, config())
	if err != nil {
		fail("admin", err)
	}
	defer a.Close()
	retention := "3600000"
	err = a.CreateTopic(topic, &sarama.TopicDetail{
		NumPartitions:     3,
		ReplicationFactor: 1,
		ConfigEntries:     map[string]*string{"retention.ms": &retention},
	}, false)
	if err != nil {
		fail("create topic", err)
	}
	again := a.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false)
	topics, err := a.ListTopics()
	if err != nil {
		fail("list topics", err)
	}
	detail, listed := topics[topic]
	entries, err := a.DescribeConfig(sarama.ConfigResource{
		Type: sarama.TopicResource, Name: topic, ConfigNames: []string{"retention.ms"},
	})
	if err != nil {
		fail("describe config", err)
	}
	configs := map[string]string{}
	for _, e := range entries {
		configs[e.Name] = e.Value
	}
	if err := a.DeleteTopic(topic); err != nil {
		fail("delete topic", err)
	}
	after, err := a.ListTopics()
	if err != nil {
		fail("list topics", err)
	}
	_, stillListed := after[topic]
	againText := ""
	if again != nil {
		againText = again.Error()
	}
	emit(map[string]interface{}{
		"listed": listed, "partitions": detail.NumPartitions, "configs": configs,
		"create_again": againText, "listed_after_delete": stillListed,
	})
}

func main() {
	args := os.Args[1:]
	if len(args) < 3 {
		fail("usage", fmt.Errorf("produce|produce-invalid|group|admin|consume BOOTSTRAP ..."))
	}
	switch args[0] {
	case "produce":
		produce(args[1], args[2], atoi(args[3]))
	case "produce-invalid":
		produceInvalid(args[1], args[2])
	case "group":
		group(args[1], args[2], args[3], atoi(args[4]))
	case "admin":
		admin(args[1], args[2])
	case "consume":
		consume(args[1], args[2], int32(atoi(args[3])), atoi(args[4]))
	default:
		fail("usage", fmt.Errorf("unknown command %q", args[0]))
	}
}
