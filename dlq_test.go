package troupe_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/worker"
)

// A bad packet is dead-lettered as a bounded prefix with the whole
// packet's size and SHA-256, not whole: 1 MiB of garbage costs Redis a few
// KiB.
func TestDLQKeepsABoundedPrefixOfBadPackets(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	garbage := bytes.Repeat([]byte{0xff}, 1<<20-4096) // under NATS's 1 MiB payload limit; never decodes
	f.publishRaw(f.subj.Submit, garbage)
	e := f.waitDLQ(func(e store.DLQEntry) bool { return e.Reason == jobstate.ReasonDecodeFailed })

	sum := sha256.Sum256(garbage)
	if len(e.Raw) > 4096 || !bytes.HasPrefix(garbage, e.Raw) || len(e.Raw) == 0 {
		t.Fatalf("entry keeps %d bytes of the packet, want a prefix of at most 4096", len(e.Raw))
	}
	if e.RawSize != int64(len(garbage)) || e.RawSHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("entry says size %d sha256 %q; packet %d %x", e.RawSize, e.RawSHA256, len(garbage), sum)
	}
	// What Redis holds for it.
	msgs, err := f.node.Store().Client().XRange(context.Background(), f.node.Store().Keys().DLQ(), e.ID, e.ID).Result()
	if err != nil || len(msgs) != 1 {
		t.Fatalf("entry %s: %v %v", e.ID, msgs, err)
	}
	held := 0
	for k, v := range msgs[0].Values {
		held += len(k) + len(fmt.Sprint(v))
	}
	if held > 4096+1024 {
		t.Fatalf("Redis holds %d bytes for the entry", held)
	}
	if b := counter(t, f.node, "troupe_dlq_bytes", ""); b < 4096 || b > 4096+1024 {
		t.Fatalf("troupe_dlq_bytes %v for one entry of %d bytes", b, held)
	}
}

// When the DLQ cannot take a bad packet (here the DLQ key holds the wrong
// type; in the field, Redis out of memory), the packet is dropped with a
// log line and a count, not offered again and again, and jobs still run.
func TestDLQWriteFailureDropsTheBadPacketAndJobsRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.startWorker("w1", true, nil, worker.Echo)
	ctx := context.Background()
	if err := f.env.Redis.Set(ctx, f.node.Store().Keys().DLQ(), "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		f.publishRaw(f.subj.Submit, bytes.Repeat([]byte{0xff}, 1000+i))
	}
	waitNoPending(t, f.js, bus.StreamName(f.env.StreamPrefix(), bus.StreamSubmit), bus.ConsumerName(bus.StreamSubmit))
	if got := counter(t, f.node, "troupe_dlq_write_failures_total", string(jobstate.ReasonDecodeFailed)); got != 5 {
		t.Fatalf("dlq write failures counted %v, want 5", got)
	}
	f.submit(echoReq("after-bad-input"))
	f.waitState("after-bad-input", jobstate.StateSucceeded)
}
