package safety

import (
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// HashJobRequest is CAP's job hash: sha256 of the deterministic protobuf
// encoding of req without the labels that record the approval itself
// (approval_*), the bus message id label (cordum.bus_msg_id) and the
// effective-config env entry. An approval is bound to this hash: if the job
// changes, the approval no longer applies.
func HashJobRequest(req *capv1.JobRequest) string { return jobstate.HashRequest(req) }
