package admin

import (
	"net/http"
	"strings"
)

// Pausing a topic's dispatch (router.MappingStore.Pause): its jobs wait
// SCHEDULED pool_paused, on every replica, until it is resumed. The node
// serving the request applies it before answering; the other replicas
// within a second (their pools watcher's poll).

// Paused answers POST /v1/pools/{topic}/pause and /resume.
type Paused struct {
	Topic  string `json:"topic"`
	Paused bool   `json:"paused"`
}

// pausePool serves POST /v1/pools/{topic}/pause and .../resume: an
// all-tenant key with role operator.
func (s *Server) pausePool(w http.ResponseWriter, r *http.Request, p principal) error {
	path := r.PathValue("topic")
	topic, action := path, ""
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		topic, action = path[:i], path[i+1:]
	}
	if topic == "" || (action != "pause" && action != "resume") {
		return errNotFound("POST /v1/pools/{topic}/pause or /v1/pools/{topic}/resume")
	}
	if p.role != RoleOperator {
		s.refused.WithLabelValues(RefusedNotOperator).Inc()
		return errForbidden("pausing a topic needs a key with role " + string(RoleOperator))
	}
	var err error
	if action == "pause" {
		err = s.cfg.Node.PauseTopic(r.Context(), topic)
	} else {
		err = s.cfg.Node.ResumeTopic(r.Context(), topic)
	}
	if err != nil {
		return err
	}
	s.audit("topic "+action+"d", "topic", topic, "by", p.by())
	writeJSON(w, http.StatusOK, Paused{Topic: topic, Paused: action == "pause"})
	return nil
}
