package admin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/store"
)

// apiHandler serves one API request as principal p. It writes a success
// response itself and returns an error for anything else; api maps the
// error to a status and a JSON body in one place.
type apiHandler func(w http.ResponseWriter, r *http.Request, p principal) error

// api wraps h with authentication, the body size limit and the request
// timeout.
func (s *Server) api(sc scope, h apiHandler) http.Handler {
	return s.authenticated(sc, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
		defer cancel()
		r = r.WithContext(ctx)
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
		if err := h(w, r, principalOf(ctx)); err != nil {
			if status(err) >= 500 {
				s.log.Warn("admin request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
			writeError(w, r, err)
		}
	}))
}

// audit logs an operator's action that changes something (approve,
// reject, cancel, DLQ retry and delete, mappings): rare, and exactly what
// someone reading the log afterwards looks for. Submits are not audited;
// they are the normal traffic.
func (s *Server) audit(msg string, args ...any) {
	s.log.Info("admin: "+msg, args...)
}

// apiError is an error with the status and code the API answers with.
type apiError struct {
	Status int
	Code   string
	Msg    string
}

func (e *apiError) Error() string { return e.Msg }

func errBadRequest(msg string) error {
	return &apiError{Status: http.StatusBadRequest, Code: "bad_request", Msg: msg}
}
func errForbidden(msg string) error {
	return &apiError{Status: http.StatusForbidden, Code: "forbidden", Msg: msg}
}
func errNotFound(msg string) error {
	return &apiError{Status: http.StatusNotFound, Code: "not_found", Msg: msg}
}
func errConflict(msg string) error {
	return &apiError{Status: http.StatusConflict, Code: "conflict", Msg: msg}
}

// classify maps an error to the API's status and code: the one place where
// domain errors become HTTP.
func classify(err error) (int, string) {
	var ae *apiError
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		return ae.Status, ae.Code
	case errors.As(err, &tooBig):
		return http.StatusRequestEntityTooLarge, "body_too_large"
	case errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrDLQNotFound):
		return http.StatusNotFound, "not_found"
	case errors.Is(err, store.ErrNotAwaitingApproval), errors.Is(err, store.ErrHashMismatch),
		errors.Is(err, store.ErrAlreadyDecided), errors.Is(err, store.ErrNoJobHash),
		errors.Is(err, store.ErrAlreadyRetried):
		return http.StatusConflict, "conflict"
	case errors.Is(err, store.ErrBadCursor), errors.Is(err, router.ErrInvalidMapping):
		return http.StatusBadRequest, "bad_request"
	case errors.Is(err, store.ErrNotRetryable):
		return http.StatusUnprocessableEntity, "not_retryable"
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "timeout"
	}
	return http.StatusInternalServerError, "internal"
}

func status(err error) int { s, _ := classify(err); return s }

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

func writeError(w http.ResponseWriter, _ *http.Request, err error) {
	st, code := classify(err)
	msg := err.Error()
	if st == http.StatusInternalServerError {
		// Internal errors may carry addresses and key names; the log has
		// them, the client gets the gist.
		msg = "internal error"
	}
	writeJSON(w, st, ErrorBody{Error: msg, Code: code})
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(body)
}

// readJSON decodes the request body into v. An empty body leaves v as it is
// (every body field is optional where bodies are optional).
func readJSON(r *http.Request, v any) error {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	if len(data) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return errBadRequest("body: " + err.Error())
	}
	return nil
}
