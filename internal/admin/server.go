// Package admin is a node's HTTP face for operators: Prometheus metrics,
// health and readiness probes, a JSON API over jobs, the DLQ, workers and
// pool mappings, and the /ui dashboard, a static page embedded in the
// binary that uses the same API.
//
// Access: API keys map to tenants ("*" = every tenant). A key sees and acts
// on its own tenant's jobs only; another tenant's job is "not found" to it.
// Cluster-wide actions (pool mappings, node-wide stats) need a "*" key.
// Without any key configured the server serves everyone as "*", so it
// refuses, at construction, to listen anywhere but on loopback.
//
//	srv, err := admin.NewServer(admin.Config{Node: node, Registry: node.Metrics(), Listen: admin.ListenDefault})
//	if err != nil { ... }
//	if err := srv.Start(); err != nil { ... }
//	defer srv.Stop(context.Background())
package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/jobtrace"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Defaults for Config fields left zero.
const (
	// MaxBodyBytesDefault bounds a request body: room for a submit whose
	// payload is jobdata.MaxBytesDefault (1 MiB) of bytes in base64.
	MaxBodyBytesDefault = 2 << 20
	// RequestTimeoutDefault bounds the work behind one request.
	RequestTimeoutDefault = 30 * time.Second
	// ReadyTimeoutDefault bounds the readiness checks; a probe that takes
	// longer is itself the answer.
	ReadyTimeoutDefault = 2 * time.Second
	// readHeaderTimeout cuts off clients that open a connection and dribble
	// headers (slowloris).
	readHeaderTimeout = 10 * time.Second
	// shutdownGrace is how long Stop waits for requests in flight when its
	// context has no deadline.
	shutdownGrace = 5 * time.Second
)

// Where the API is by default: a node serves it on ListenDefault (loopback,
// the only place it may listen without API keys) and the troupe CLI's API
// commands (ctl, workers, trace) call URLDefault.
const (
	ListenDefault = "127.0.0.1:8080"
	URLDefault    = "http://" + ListenDefault
)

// AllTenants, as a key's tenant, lets the key see and act on every tenant
// and on cluster-wide settings.
const AllTenants = "*"

// Node is what the server needs of a node; *troupe.Node implements it.
type Node interface {
	ID() string
	Submit(ctx context.Context, req *capv1.JobRequest) error
	Job(ctx context.Context, jobID string) (*store.JobRecord, error)
	JobLinks(ctx context.Context, jobID string) (store.JobLinks, error)
	JobTenants(ctx context.Context, jobIDs []string) (map[string]string, error)
	ListJobs(ctx context.Context, q store.ListQuery) (store.JobPage, error)
	// CountStates counts the jobs in each of states (none: every state).
	CountStates(ctx context.Context, states ...jobstate.State) (map[jobstate.State]int64, error)
	Decide(ctx context.Context, jobID string, d store.Decision, by, reason, hash string) error
	Cancel(ctx context.Context, jobID, reason, by string) error
	MarkCancel(ctx context.Context, jobID string, tenants []string, by, reason string) error
	JobTrace(ctx context.Context, jobID string) ([]jobtrace.Entry, error)
	JobTraceEnabled() bool

	ListDLQ(ctx context.Context, limit int64) ([]store.DLQEntry, error)
	DLQEntry(ctx context.Context, entryID string) (*store.DLQEntry, error)
	DLQRetried(ctx context.Context, entryIDs []string) (map[string]string, error)
	DeleteDLQ(ctx context.Context, entryID string) error
	RetryDLQ(ctx context.Context, entryID string, force bool) (string, error)

	Workers() ([]router.WorkerInfo, error)
	LiveJobActors() (int, error)
	QueuePosition(ctx context.Context, jobID string) (int, error)
	WaitingJob(ctx context.Context, jobID string) (*router.Waiting, error)
	WaitingJobs(ctx context.Context, tenant string, limit int) ([]router.Waiting, error)
	PoolConfig() *router.PoolConfig
	Mappings() *router.MappingStore

	Ready(ctx context.Context) error

	Saga(ctx context.Context, workflowID string) (*saga.Report, error)
	ListSagas(ctx context.Context, limit int, cursor string) ([]saga.Listed, string, error)
	RetryJob(ctx context.Context, jobID string) (string, error)
	PauseTopic(ctx context.Context, topic string) error
	ResumeTopic(ctx context.Context, topic string) error
}

// Config configures a Server.
type Config struct {
	// Node is the node the API operates (required).
	Node Node
	// Registry is served at /metrics (required: the node's, Node.Metrics()).
	Registry *prometheus.Registry
	// Listen is the address, host:port (ListenDefault is the usual one;
	// "127.0.0.1:0" picks a free port).
	Listen string
	// APIKeys maps each API key to its tenant (AllTenants for every
	// tenant), with the tenant's DefaultRole. Empty, and Keys empty too: no
	// authentication, loopback only.
	APIKeys map[string]string
	// Keys maps API keys to full entries (tenant, role, name), as
	// ParseKeyEntries reads them; a key may be in APIKeys or Keys, not both.
	Keys map[string]Key
	// AllowSelfApproval lets a principal approve or reject a job it
	// submitted through the API. Off by default: an approval is a second
	// person's review. Without keys there are no identities and it does
	// not apply.
	AllowSelfApproval bool
	// MetricsNeedKey makes /metrics require an all-tenant key (metric
	// labels name topics and pools, which a deployment may consider
	// private) and /readyz any valid key (its body names the failing
	// dependency). /healthz stays open: it says nothing but "alive".
	MetricsNeedKey bool
	// MaxBodyBytes bounds request bodies (default MaxBodyBytesDefault,
	// raised to hold a MaxPayloadBytes payload in base64).
	MaxBodyBytes int64
	// MaxPayloadBytes bounds the payload a submit stores as the job's
	// input (default jobdata.MaxBytesDefault); a larger one is refused 413.
	MaxPayloadBytes int64
	// DataBodyBytes bounds each body GET /v1/jobs/{id}/data returns
	// (default DataBodyBytesDefault); the rest is cut.
	DataBodyBytes int64
	// RequestTimeout bounds each API request (default RequestTimeoutDefault).
	RequestTimeout time.Duration
	// ReadyTimeout bounds /readyz (default ReadyTimeoutDefault).
	ReadyTimeout time.Duration
	// SampleEvery is the throughput sampling period behind the dashboard's
	// chart (default ThroughputSampleEvery); ThroughputWindow is kept.
	SampleEvery time.Duration
	// SeriesStep is the step of GET /v1/series (default SeriesStep; taken
	// on the throughput sampler's ticks, so at least SampleEvery).
	SeriesStep time.Duration
	// Log receives the server's lines (default slog.Default()).
	Log *slog.Logger
}

// ErrPublicWithoutKeys is returned by NewServer for a non-loopback Listen
// address with no API key configured.
var ErrPublicWithoutKeys = errors.New("admin: without API keys the server listens on loopback only")

// Server is the admin HTTP server.
type Server struct {
	// Immutable after NewServer.
	cfg     Config
	log     *slog.Logger
	keys    *keyring
	handler http.Handler
	sampler *sampler
	refused *prometheus.CounterVec // troupe_api_refused_total{reason}

	mu      sync.Mutex // guards the fields below
	ln      net.Listener
	srv     *http.Server
	done    chan struct{}
	stopped bool
}

// NewServer checks cfg and builds the server; it does not listen yet.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Node == nil {
		return nil, errors.New("admin: config needs Node")
	}
	if cfg.Registry == nil {
		return nil, errors.New("admin: config needs Registry")
	}
	if cfg.Listen == "" {
		return nil, errors.New("admin: config needs Listen (host:port)")
	}
	keys, err := newKeyring(cfg.APIKeys, cfg.Keys)
	if err != nil {
		return nil, err
	}
	if keys.empty() {
		loop, err := isLoopback(cfg.Listen)
		if err != nil {
			return nil, err
		}
		if !loop {
			return nil, fmt.Errorf("%w (listen %q)", ErrPublicWithoutKeys, cfg.Listen)
		}
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = MaxBodyBytesDefault
	}
	if need := cfg.MaxPayloadBytes/3*4 + 64<<10; cfg.MaxBodyBytes < need {
		cfg.MaxBodyBytes = need // a payload as large as allowed, in base64, fits in a body
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = RequestTimeoutDefault
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = ReadyTimeoutDefault
	}
	if cfg.SampleEvery <= 0 {
		cfg.SampleEvery = ThroughputSampleEvery
	}
	if cfg.SeriesStep <= 0 {
		cfg.SeriesStep = SeriesStep
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	refused, err := refusedCounter(cfg.Registry)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Log.With("component", "admin"), keys: keys,
		sampler: newSampler(cfg.Registry, cfg.SampleEvery, ThroughputWindow), refused: refused}
	s.sampler.series = newSeries(func(ctx context.Context) (map[jobstate.State]int64, error) {
		return cfg.Node.CountStates(ctx, seriesStates...)
	}, cfg.SeriesStep)
	s.handler = s.routes()
	return s, nil
}

// isLoopback reports whether a listen address binds loopback only. An
// empty host binds every interface; a name other than localhost could
// resolve anywhere, so it does not count.
func isLoopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("admin: listen address %q: %w", addr, err)
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}

// Start listens on Config.Listen and serves in the background.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil || s.stopped {
		return errors.New("admin: already started (a server starts once)")
	}
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("admin: listen: %w", err)
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s.handler, ReadHeaderTimeout: readHeaderTimeout,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	s.done = make(chan struct{})
	go s.sampler.run()
	go func(srv *http.Server, done chan struct{}) {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin server stopped", "err", err)
		}
	}(s.srv, s.done)
	s.log.Info("admin API listening", "addr", ln.Addr().String(), "auth", !s.keys.empty())
	return nil
}

// Addr returns the address the server listens on ("" before Start).
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Stop stops accepting requests and waits for those in flight (bounded by
// ctx, or shutdownGrace when ctx has no deadline).
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	srv, done := s.srv, s.done
	if srv == nil || s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	s.mu.Unlock()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, shutdownGrace)
		defer cancel()
	}
	err := srv.Shutdown(ctx)
	<-done
	close(s.sampler.stop)
	<-s.sampler.done
	return err
}

// routes builds the handler. Go 1.22 patterns carry the method and path
// parameters; the mux answers 405 and 404 itself.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	api := func(pattern string, scope scope, h apiHandler) {
		mux.Handle(pattern, s.api(scope, h))
	}
	api("POST /v1/jobs", anyTenant, s.submitJob)
	api("GET /v1/jobs", anyTenant, s.listJobs)
	api("GET /v1/jobs/{id}", anyTenant, s.getJob)
	api("POST /v1/jobs/{id}/approve", operators, s.decideJob(store.DecisionApproved))
	api("POST /v1/jobs/{id}/reject", operators, s.decideJob(store.DecisionRejected))
	api("POST /v1/jobs/{id}/cancel", anyTenant, s.cancelJob)
	api("GET /v1/jobs/{id}/trace", anyTenant, s.jobTrace)
	api("POST /v1/jobs/{id}/retry", anyTenant, s.retryJob)
	api("POST /v1/jobs/bulk", anyTenant, s.bulkJobs)
	api("GET /v1/series", allTenants, s.series)
	api("GET /v1/jobs/{id}/data", anyTenant, s.jobData)
	api("GET /v1/dlq", anyTenant, s.listDLQ)
	api("POST /v1/dlq/{id}/retry", anyTenant, s.retryDLQ)
	api("DELETE /v1/dlq/{id}", anyTenant, s.deleteDLQ)
	api("GET /v1/workers", anyTenant, s.listWorkers)
	api("GET /v1/pools", anyTenant, s.listPools)
	api("GET /v1/pools/{topic...}", anyTenant, s.getPool)
	api("PUT /v1/pools/{topic...}", allTenants, s.putPool)
	api("DELETE /v1/pools/{topic...}", allTenants, s.deletePool)
	// POST /v1/pools/{topic}/pause and /resume (a {topic...} wildcard
	// must end the pattern).
	api("POST /v1/pools/{topic...}", allTenants, s.pausePool)
	api("GET /v1/stats", allTenants, s.stats)
	api("GET /v1/whoami", anyTenant, s.whoami)
	// A workflow's steps may belong to several tenants: all-tenant keys only.
	api("GET /v1/sagas", allTenants, s.listSagas)
	api("GET /v1/sagas/{id}", allTenants, s.getSaga)
	s.scheduleRoutes(api)                           // schedules.go
	s.keyRoutes(api)                                // keys.go
	api("GET /v1/limits", allTenants, s.listLimits) // limits.go

	// OpenMetrics for scrapers that ask for it: the only format that
	// carries exemplars (the job latency histograms' trace ids, when tracing
	// is on).
	metrics := promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		EnableOpenMetrics: true})
	if s.cfg.MetricsNeedKey {
		mux.Handle("GET /metrics", s.authenticated(allTenants, metrics))
	} else {
		mux.Handle("GET /metrics", s.hostChecked(metrics))
	}
	mux.Handle("GET /healthz", s.hostChecked(http.HandlerFunc(s.healthz)))
	if s.cfg.MetricsNeedKey {
		mux.Handle("GET /readyz", s.authenticated(anyTenant, http.HandlerFunc(s.readyz)))
	} else {
		mux.Handle("GET /readyz", s.hostChecked(http.HandlerFunc(s.readyz)))
	}
	mux.Handle("GET /ui/", s.hostChecked(uiHandler()))
	mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
	return mux
}

// Reasons of troupe_api_refused_total: requests refused for who sent them
// or for the state they would overwrite, not for malformed input.
const (
	RefusedNotOperator      = "not_operator"
	RefusedSelfApproval     = "self_approval"
	RefusedAlreadyDecided   = "already_decided"
	RefusedHashMismatch     = "hash_mismatch"
	RefusedBodyNamesAnother = "body_names_another"
)

// refusedCounter registers troupe_api_refused_total in reg, or returns the
// one a server on the same registry registered already.
func refusedCounter(reg *prometheus.Registry) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_api_refused_total",
		Help: "Admin API requests refused for their principal or for a decision already taken, by reason."},
		[]string{"reason"})
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if prev, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return prev, nil
			}
		}
		return nil, fmt.Errorf("admin: register metrics: %w", err)
	}
	return c, nil
}
