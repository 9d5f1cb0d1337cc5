package jobdata_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobdata"
	"github.com/troupe-run/troupe/internal/testenv"
)

func TestPointersAndOwnership(t *testing.T) {
	if p := jobdata.InputPointer("j1"); p != "redis://ctx:j1" {
		t.Fatalf("input pointer %q", p)
	}
	for ptr, want := range map[string]bool{
		"redis://ctx:j1": true, "redis://res:j1": true, "redis://res:j1:redacted": true, "redis://ctx:j1:comp": true,
		"redis://ctx:j2": false, "redis://ctx:j1x": false, "s3://ctx:j1": false, "": false,
	} {
		if got := jobdata.OwnedBy(ptr, "j1"); got != want {
			t.Errorf("OwnedBy(%q, j1) = %v", ptr, got)
		}
	}
	for _, ptr := range []string{"redis://troupe:job:x", "s3://b/k", "redis://ctx:", "ctx:j1"} {
		if _, err := jobdata.Key(ptr); !errors.Is(err, jobdata.ErrNotHeld) {
			t.Errorf("Key(%q): %v, want ErrNotHeld", ptr, err)
		}
	}
	for data, want := range map[string]string{`{"a":1}`: jobdata.TypeJSON, "héllo": jobdata.TypeText, "\xff\x00": jobdata.TypeBinary} {
		if got := jobdata.ContentType([]byte(data)); got != want {
			t.Errorf("ContentType(%q) = %s", data, got)
		}
	}
	if jobdata.TTLFor(-1) != 0 || jobdata.TTLFor(time.Hour) != 2*time.Hour {
		t.Fatal("TTLFor")
	}
}

// Values are written within the cap with the store's TTL, read whole or in
// part with their full size, and a missing key is told from an empty value.
func TestStoreWritesAndReads(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	id := env.Prefix + "-d"
	t.Cleanup(func() { env.Client.Del(ctx, "ctx:"+id, "res:"+id) })
	st := &jobdata.Store{Client: env.Client, MaxBytes: 10, TTL: time.Minute}
	if _, err := st.PutInput(ctx, id, []byte("0123456789a")); !errors.Is(err, jobdata.ErrTooLarge) {
		t.Fatalf("oversize: %v", err)
	}
	if _, _, err := st.Read(ctx, jobdata.InputPointer(id), 4); !errors.Is(err, jobdata.ErrMissing) {
		t.Fatalf("missing: %v", err)
	}
	ptr, err := st.PutInput(ctx, id, []byte("0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	if ttl := env.Client.TTL(ctx, "ctx:"+id).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("TTL %s", ttl)
	}
	data, size, err := st.Read(ctx, ptr, 4)
	if err != nil || string(data) != "0123" || size != 10 {
		t.Fatalf("read 4: %q %d %v", data, size, err)
	}
	if data, err := st.Get(ctx, ptr); err != nil || string(data) != "0123456789" {
		t.Fatalf("get: %q %v", data, err)
	}
	rptr, err := st.PutResult(ctx, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	if data, size, err := st.Read(ctx, rptr, 4); err != nil || len(data) != 0 || size != 0 {
		t.Fatalf("empty value: %q %d %v", data, size, err)
	}
}
