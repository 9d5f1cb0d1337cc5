package safety

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/proto/capv1"
)

// HashJobRequest is CAP's job hash: sha256 of the deterministic protobuf
// encoding of req without the labels that record the approval itself
// (approval_*), the bus message id label (cordum.bus_msg_id) and the
// effective-config env entry. An approval is bound to this hash: if the job
// changes, the approval no longer applies.
func HashJobRequest(req *capv1.JobRequest) string {
	c := proto.Clone(req).(*capv1.JobRequest)
	for k := range c.Labels {
		if strings.HasPrefix(k, "approval_") || k == "cordum.bus_msg_id" {
			delete(c.Labels, k)
		}
	}
	delete(c.Env, "CORDUM_EFFECTIVE_CONFIG")
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
