package admin

import (
	"bytes"
	"errors"
	"net/http/httptest"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/troupe-run/troupe/internal/intake"
	"github.com/troupe-run/troupe/proto/capv1"
)

// No request body, however malformed, makes the API's body handling panic:
// a submit body is a CAP JobRequest in protojson that must then pass the
// intake's validation; action and pool bodies are plain JSON. Every
// rejection is a client error with a reason.
func FuzzRequestBodies(f *testing.F) {
	for _, seed := range []string{
		`{"jobId":"job-1","topic":"job.echo","labels":{"a":"b"}}`,
		`{"job_id":"x y","topic":"job.*"}`,
		`{"reason":"ok","by":"alice","hash":"abc"}`,
		`{"pools":["a","b"]}`, `{"pools":"a"}`, `[]`, `null`, `{"topic":`, "",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &capv1.JobRequest{}
		if err := (protojson.UnmarshalOptions{}).Unmarshal(data, req); err == nil {
			if err := intake.ValidateRequest(req); err != nil && !errors.Is(err, intake.ErrInvalid) {
				t.Fatalf("unclassified validation error: %v", err)
			}
		}
		for _, v := range []any{&actionBody{}, &PoolMapping{}} {
			r := httptest.NewRequest("POST", "/", bytes.NewReader(data))
			if err := readJSON(r, v); err != nil {
				var he *apiError
				if !errors.As(err, &he) || he.Status != 400 || he.Msg == "" {
					t.Fatalf("body error is not a 400 with a reason: %v", err)
				}
			}
		}
	})
}
