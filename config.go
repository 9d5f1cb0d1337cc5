package troupe

import (
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/troupe-run/troupe/internal/connect"
	"github.com/troupe-run/troupe/internal/ratelimit"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/safety"
	"github.com/troupe-run/troupe/signing"
)

// Defaults for Config fields left empty.
const (
	// StreamPrefixDefault names the JetStream streams (TROUPE_SUBMIT, ...).
	StreamPrefixDefault = "TROUPE"
	// KeyPrefixDefault starts every Redis key.
	KeyPrefixDefault = "troupe:"
)

// Config configures a node: what a user sets — where NATS and Redis are
// and how to reach them, the node's id and name prefixes, routing,
// policies, signing, metrics, logs and tracing — and, in Tuning, every
// other knob. Only the two addresses (or clients) are needed.
type Config struct {
	// NodeID names this replica in locks and history (default: hostname-pid).
	NodeID string

	// NATSURL is the NATS server, or several separated by commas (default
	// TROUPE_NATS_URL, then nats://127.0.0.1:4222).
	NATSURL string
	// NATSAuth are the credentials and TLS settings used to dial NATSURL
	// (zero: only what the URL carries).
	NATSAuth NATSAuth
	// NATS, when set, is used instead of dialing NATSURL (the caller closes it).
	NATS *nats.Conn

	// RedisURL is the Redis server (default TROUPE_REDIS_URL, then
	// redis://127.0.0.1:6379; rediss:// for TLS); several addresses
	// separated by commas are the seeds of a Redis Cluster.
	RedisURL string
	// RedisAuth are the ACL credentials and TLS settings used to dial
	// RedisURL (zero: only what the URL carries).
	RedisAuth RedisAuth
	// Redis, when set, is used instead of dialing RedisURL (the caller closes it).
	Redis redis.UniversalClient

	// KeyPrefix starts every Redis key (default KeyPrefixDefault).
	KeyPrefix string
	// SubjectPrefix is put before every CAP subject ("" = the standard names).
	SubjectPrefix string
	// StreamPrefix names the JetStream streams (default StreamPrefixDefault).
	StreamPrefix string
	// Pools is the routing config, built in Go (see DefaultPools) or
	// parsed (ParsePools); PoolsFile is read when Pools is nil, and
	// then re-read on change and on ReloadPools (SIGHUP in `troupe node`).
	// Neither: DefaultPools, the CLI's routing.
	// Runtime topic mappings in Redis (`troupe ctl pools set`) override both.
	Pools     *Pools
	PoolsFile string

	// Policy is the input policy (default safety.AllowAll).
	Policy safety.InputPolicy
	// Output, when set, checks every result before it is called SUCCEEDED
	// (metadata) and scans its content after (a *safety.OutputPolicy, e.g. safety.DefaultOutputPolicy()).
	Output safety.OutputChecker

	// Metrics is where the node registers its Prometheus metrics (default:
	// a fresh registry, see Node.Metrics).
	Metrics *prometheus.Registry

	// Signer, when set, signs every packet the node publishes (CAP field
	// 14): dispatches, cancels, sys.job.dlq events and saga submits (sender
	// ids <NodeID> and troupe-saga/<NodeID>), and Submit and Cancel, which
	// then go out under the node id. Give the node a stable NodeID and list
	// it in the key sets of whoever verifies. See SECURITY.md.
	Signer *signing.Signer
	// Verifier, when set, checks the signature of every submit, result,
	// cancel, heartbeat and progress before the node acts on it; see
	// SECURITY.md, "Packet signatures", for what happens to a rejected packet.
	Verifier *signing.Verifier
	// TracerProvider, when set, receives an OpenTelemetry span per job
	// activation and per state the job passes through (README, "Tracing
	// with OpenTelemetry"); the node does not shut it down. Build it with
	// sdktrace.WithIDGenerator(troupe.TraceIDGenerator()) so a job whose client
	// sent a CAP trace id but no traceparent keeps that trace id.
	TracerProvider trace.TracerProvider
	// OTLPEndpoint, when TracerProvider is nil, makes the node export those
	// spans over OTLP/gRPC to this receiver ("host:port" or
	// "http://host:port": plaintext; "https://host:port": TLS), flushing
	// them in Stop. Empty: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
	// OTEL_EXPORTER_OTLP_ENDPOINT, when set, turns export on the same way
	// (with the other OTEL_EXPORTER_OTLP_* settings); otherwise tracing is
	// off and costs the job path nothing.
	OTLPEndpoint string

	// Logger receives the node's logs (default slog.Default()).
	Logger *slog.Logger

	// Tuning holds every other knob; its zero fields take their
	// DefaultTuning values (NewNode fills them).
	Tuning Tuning

	// routing is Pools or PoolsFile in the router's form (NewNode).
	routing *router.PoolConfig
	// rates are the rate limit buckets of Pools or PoolsFile (NewNode).
	rates *ratelimit.Spec

	// backoff overrides the scheduling retry delay (tests: SetBackoff).
	backoff func(attempt int) time.Duration
}

// NATSAuth are the credentials and TLS settings of a NATS connection
// (Config.NATSAuth; the flags of `troupe node` fill them; see
// SECURITY.md). Credentials may also be in the URL
// (nats://user:pass@host, nats://token@host), which then must be the only
// ones. Give one kind of credential at most. The zero value connects with
// what the URL carries.
type NATSAuth struct {
	User string
	// Password, or PasswordFile holding it (one of the two).
	Password     string
	PasswordFile string
	// Token, or TokenFile holding it (one of the two).
	Token     string
	TokenFile string
	// NKeyFile is a user NKey seed file (the seed never leaves this process:
	// the server's nonce is signed with it).
	NKeyFile string
	// CredsFile is a .creds file (user JWT and NKey seed), for servers in
	// operator (decentralised JWT) mode.
	CredsFile string
	TLS       TLSSettings
}

// RedisAuth are the ACL credentials and TLS settings of a Redis connection
// (Config.RedisAuth; see SECURITY.md).
type RedisAuth struct {
	// User is the ACL user (default: "default"); credentials in the URL
	// (redis://user:pass@host) are the alternative, not an addition.
	User string
	// Password, or PasswordFile holding it (one of the two).
	Password     string
	PasswordFile string
	// Cluster makes a Redis Cluster client even from a single seed address
	// (several addresses always do).
	Cluster bool
	TLS     TLSSettings
}

// TLSSettings say how a client verifies its server and proves itself to
// it. Any field set turns TLS on.
type TLSSettings struct {
	// CAFile is a PEM bundle that verifies the server (default: the system roots).
	CAFile string
	// CertFile and KeyFile, both or neither, are the client's certificate for
	// servers that require one (mutual TLS).
	CertFile string
	KeyFile  string
	// ServerName is the name verified in the server's certificate (default:
	// the host dialed).
	ServerName string
	// InsecureSkipVerify accepts any server certificate. For tests only: it
	// is logged as a warning.
	InsecureSkipVerify bool
}

// conn is a in connect's form (the dialer's).
func (a NATSAuth) conn() connect.NATS {
	return connect.NATS{User: a.User, Password: a.Password, PasswordFile: a.PasswordFile, Token: a.Token,
		TokenFile: a.TokenFile, NKeyFile: a.NKeyFile, CredsFile: a.CredsFile, TLS: connect.TLS(a.TLS)}
}

// conn is a in connect's form (the dialer's).
func (a RedisAuth) conn() connect.Redis {
	return connect.Redis{User: a.User, Password: a.Password, PasswordFile: a.PasswordFile, Cluster: a.Cluster,
		TLS: connect.TLS(a.TLS)}
}
