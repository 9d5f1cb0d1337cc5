package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/jobdata"
	"github.com/troupe-run/troupe/proto/capv1"
)

// jobDataFlags are submit's flags for a job's data and its place in a
// workflow: what the request carries beyond its topic and labels.
type jobDataFlags struct {
	payloadFile  string
	payloadJSON  string
	env          labelsFlag
	workflowID   string
	step         int
	compensation string
	stdin        io.Reader
}

func (d *jobDataFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.payloadFile, "payload", "", "the job's input: a file, or - for stdin; Troupe stores it under ctx:<job_id> and sets context_ptr redis://ctx:<job_id>, where CAP workers read it (at most 1 MiB by default)")
	fs.StringVar(&d.payloadJSON, "payload-json", "", "the job's input given inline, e.g. '{\"n\": 3}' (instead of --payload)")
	d.env = labelsFlag{}
	fs.Var(d.env, "env", "job env entry key=value (repeatable); troupe worker honours demo.fail=1, demo.fatal=1, demo.sleep=2s, demo.error=<message>")
	fs.StringVar(&d.workflowID, "workflow-id", "", "the workflow (saga) this job is a step of")
	fs.IntVar(&d.step, "step", 0, "the step's index in its workflow (--workflow-id)")
	fs.StringVar(&d.compensation, "compensation", "", "TOPIC[:payload]: the job that undoes this step if a later step of the workflow fails fatally; the payload (JSON or text) is the compensation's input, else it gets the step's")
}

// apply fills req from the flags and returns the input and compensation
// payloads to store (nil: none).
func (d *jobDataFlags) apply(req *capv1.JobRequest) (input, comp []byte, err error) {
	switch {
	case d.payloadFile != "" && d.payloadJSON != "":
		return nil, nil, errors.New("give --payload or --payload-json, not both")
	case (d.payloadFile != "" || d.payloadJSON != "") && req.ContextPtr != "":
		return nil, nil, errors.New("give --payload or --context-ptr, not both (the payload's pointer is the context pointer)")
	case d.payloadFile == "-":
		in := d.stdin
		if in == nil {
			in = os.Stdin
		}
		if input, err = io.ReadAll(io.LimitReader(in, jobdata.MaxBytesDefault*16)); err != nil {
			return nil, nil, fmt.Errorf("--payload -: %w", err)
		}
	case d.payloadFile != "":
		if input, err = os.ReadFile(d.payloadFile); err != nil {
			return nil, nil, fmt.Errorf("--payload: %w", err)
		}
	case d.payloadJSON != "":
		input = []byte(d.payloadJSON)
		if !jsonValid(input) {
			return nil, nil, errors.New("--payload-json is not JSON (use --payload FILE for other bytes)")
		}
	}
	if input == nil && (d.payloadFile != "" || d.payloadJSON != "") {
		input = []byte{}
	}
	if len(d.env) > 0 {
		req.Env = map[string]string(d.env)
	}
	if d.step != 0 && d.workflowID == "" {
		return nil, nil, errors.New("--step needs --workflow-id")
	}
	req.WorkflowId, req.StepIndex = d.workflowID, int32(d.step)
	if d.compensation != "" {
		if d.workflowID == "" {
			return nil, nil, errors.New("--compensation needs --workflow-id (a compensation undoes a workflow's step)")
		}
		topic, payload, hasPayload := strings.Cut(d.compensation, ":")
		if topic == "" {
			return nil, nil, errors.New("--compensation TOPIC[:payload]: the topic is missing")
		}
		req.Compensation = &capv1.Compensation{Topic: topic}
		if hasPayload {
			comp = []byte(payload)
		}
	}
	return input, comp, nil
}

// storeOnBus stores the payloads itself, for a submit that bypasses the
// API (--bus), and points req at them.
func storeOnBus(ctx context.Context, c *common, req *capv1.JobRequest, input, comp []byte) error {
	if input == nil && comp == nil {
		return nil
	}
	rdb, err := c.dialRedis(ctx)
	if err != nil {
		return err
	}
	defer rdb.Close()
	st := &jobdata.Store{Client: rdb}
	if comp != nil {
		ptr := jobdata.CompensationPointer(req.JobId)
		if err := st.Put(ctx, ptr, comp); err != nil {
			return err
		}
		req.Compensation.ContextPtr = ptr
	}
	if input != nil {
		ptr, err := st.PutInput(ctx, req.JobId, input)
		if err != nil {
			return err
		}
		req.ContextPtr = ptr
	}
	return nil
}

func jsonValid(b []byte) bool { return jobdata.ContentType(b) == jobdata.TypeJSON }

// jobWithData is `troupe job <id> --json`: the job as the API gives it,
// and its input and result under "data".
type jobWithData struct {
	admin.Job
	Data *admin.JobData `json:"data,omitempty"`
}

// jobDataOf reads a job's data, or nil when the API has none to give (a
// node without the endpoint, a job with no record).
func jobDataOf(ctx context.Context, c *admin.Client, id string) *admin.JobData {
	d, err := c.JobData(ctx, id)
	if err != nil {
		return nil
	}
	return &d
}

// dataShown bounds the bytes of one datum `troupe job` prints.
const dataShown = 2 << 10

func printJobData(w io.Writer, d *admin.JobData) {
	if d == nil {
		return
	}
	printDatum(w, "input", d.Input)
	printDatum(w, "result", d.Result)
}

func printDatum(w io.Writer, name string, x *admin.Datum) {
	if x == nil {
		return
	}
	var notes []string
	if !x.Held {
		notes = append(notes, "not held by Troupe")
	}
	if x.Truncated {
		notes = append(notes, "truncated")
	}
	if x.Redacted {
		notes = append(notes, "redacted")
	}
	if x.Note != "" {
		notes = append(notes, x.Note)
	}
	head := fmt.Sprintf("  %s %s", name, x.Pointer)
	if x.Held {
		head += fmt.Sprintf(" (%d bytes, %s)", x.Size, x.ContentType)
	}
	if len(notes) > 0 {
		head += " [" + strings.Join(notes, "; ") + "]"
	}
	fmt.Fprintln(w, head)
	if x.Body == nil {
		return
	}
	var body string
	switch b := x.Body.(type) {
	case string:
		body = b
		if x.Encoding != "" {
			body = x.Encoding + ":" + b
		}
	default:
		raw, _ := json.Marshal(b)
		body = string(raw)
	}
	if len(body) > dataShown {
		body = body[:dataShown] + "… (--json for all the API gives)"
	}
	for _, line := range strings.Split(strings.TrimRight(body, "\n"), "\n") {
		fmt.Fprintln(w, "    "+line)
	}
}
