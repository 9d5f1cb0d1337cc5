package bus_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/connect/conntest"
)

// Each input stream reserves its MaxBytes from JetStream's file storage
// when it is made. On a server with 300 MiB to reserve, the default
// 256 MiB a stream cannot be made three times: the node's start fails with
// JetStream's refusal and what to change. With 64 MiB a stream the three
// fit; a later start with 32 MiB sets it on the streams that exist, and the
// keeper recreates a deleted stream with the operator's bound, not the
// default.
func TestStreamsReserveTheirMaxBytes(t *testing.T) {
	url := conntest.StartNATS(t, func(o *server.Options) { o.JetStreamMaxStore = 300 << 20 })
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subj := bus.NewSubjects("tstore")
	const prefix = "TSTORE"

	err = bus.EnsureStreamsWith(ctx, js, prefix, subj, bus.StreamSettings{Replicas: 1})
	var apiErr *jetstream.APIError
	if err == nil || !errors.As(err, &apiErr) || !strings.Contains(err.Error(), "--stream-max-bytes") ||
		!strings.Contains(err.Error(), "reserves 256 MiB") {
		t.Fatalf("three streams of 256 MiB on 300 MiB: err %v, want JetStream's refusal naming --stream-max-bytes", err)
	}
	t.Logf("default bound on 300 MiB: %v", err)

	bound := func(want int64) {
		t.Helper()
		for _, kind := range []bus.StreamKind{bus.StreamSubmit, bus.StreamResult, bus.StreamCancel} {
			st, err := js.Stream(ctx, bus.StreamName(prefix, kind))
			if err != nil {
				t.Fatalf("%s: %v", kind, err)
			}
			if got := st.CachedInfo().Config.MaxBytes; got != want {
				t.Errorf("%s MaxBytes %d, want %d", kind, got, want)
			}
		}
	}
	if err := bus.EnsureStreamsWith(ctx, js, prefix, subj, bus.StreamSettings{Replicas: 1, MaxBytes: 64 << 20}); err != nil {
		t.Fatalf("three streams of 64 MiB on 300 MiB: %v", err)
	}
	bound(64 << 20)
	if err := bus.EnsureStreamsWith(ctx, js, prefix, subj, bus.StreamSettings{Replicas: 1, MaxBytes: 32 << 20}); err != nil {
		t.Fatalf("the same streams at 32 MiB: %v", err)
	}
	bound(32 << 20)

	if err := js.DeleteStream(ctx, bus.StreamName(prefix, bus.StreamResult)); err != nil {
		t.Fatal(err)
	}
	k := bus.NewStreamKeeper(js, prefix, subj, 1, slog.New(slog.DiscardHandler))
	k.Settle, k.MaxBytes = -1, 32<<20
	if err := k.Check(ctx); err != nil {
		t.Fatalf("keeper check: %v", err)
	}
	bound(32 << 20)
}
