package charttest

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestChartDefaults renders the chart with its own values: three node
// replicas wired to one Redis and one NATS URL, probes on the admin port,
// non-root, the generated API key mounted, every arg a real flag, and no
// ServiceMonitor or worker.
func TestChartDefaults(t *testing.T) {
	o := render(t, ``)
	d, c := deployment(t, o, "rel-troupe")
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("replicas = %v, want 3", d.Spec.Replicas)
	}
	args := checkArgs(t, c, "node")
	checkProbes(t, d, c, args, 8080)
	checkNonRoot(t, d, c)
	from := checkFiles(t, o, d, c, args)
	for _, flag := range []string{"pools", "timeouts", "api-keys-file"} {
		if from[flag] == nil {
			t.Errorf("--%s: want a mounted file, args %v", flag, args[flag])
		}
	}
	if v := from["api-keys-file"]; v != nil && (v.Secret == nil || v.Secret.SecretName != "rel-troupe-secrets") {
		t.Errorf("--api-keys-file comes from %+v, want the chart's Secret", v)
	}
	// The generated key is one all-tenant operator entry of a long key.
	entry := string(o.Secrets["rel-troupe-secrets"].Data["api-keys"])
	key, rest, _ := strings.Cut(entry, "=")
	if len(key) < 32 || !strings.HasPrefix(rest, "* role=operator") {
		t.Errorf("generated api-keys entry %q: want <40 characters>=* role=operator", entry)
	}
	if !strings.Contains(o.Notes, "TROUPE_API_KEY=$(kubectl") {
		t.Errorf("NOTES.txt does not say how to read the generated key:\n%s", o.Notes)
	}
	if got := args["nats"]; len(got) != 1 || !strings.HasPrefix(got[0], "nats://") {
		t.Errorf("--nats = %v", got)
	}
	if got := args["redis"]; len(got) != 1 || args["redis-cluster"] != nil {
		t.Errorf("--redis = %v, --redis-cluster %v: want one URL, no cluster", got, args["redis-cluster"])
	}
	for _, flag := range []string{"redis-password-file", "sign-key", "verify-keys", "policy"} {
		if args[flag] != nil {
			t.Errorf("--%s given without its values: %v", flag, args[flag])
		}
	}
	if len(o.ServiceMonitors) != 0 {
		t.Errorf("ServiceMonitor rendered while serviceMonitor.enabled is false")
	}
	if _, ok := o.Deployments["rel-troupe-worker"]; ok {
		t.Errorf("worker Deployment rendered while worker.enabled is false")
	}
	if len(o.PDBs) != 1 {
		t.Errorf("%d PodDisruptionBudgets, want 1 for 3 replicas", len(o.PDBs))
	}
	svc, ok := o.Services["rel-troupe"]
	if !ok || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 8080 || svc.Spec.Ports[0].Name != "admin" {
		t.Errorf("Service: %+v, want port admin 8080", svc)
	}
}

// TestChartValues renders every option at once: replicas, a Redis
// Cluster with a password from the values, a NATS cluster with creds from
// an existing Secret, signing keys, a policy, retention, extra flags, a
// ServiceMonitor and the example worker.
func TestChartValues(t *testing.T) {
	o := render(t, `
replicaCount: 5
admin: {port: 9090}
redis:
  urls: [redis://r-0.redis:6379, redis://r-1.redis:6379, redis://r-2.redis:6379]
  cluster: true
  password: s3cret
nats:
  urls: [nats://n-0.nats:4222, nats://n-1.nats:4222]
  streamReplicas: 3
  streamMaxBytes: 67108864
  auth: {existingSecret: nats-creds, credsKey: troupe.creds}
apiKeys:
  entries: ["0123456789abcdef0123456789abcdef=* role=operator name=ops", "fedcba9876543210fedcba9876543210=acme"]
signing:
  enabled: true
  signKey: "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n"
  verifyKeys: "rel-troupe-*: {role: node, keys: [x]}\n"
  workerSignKey: "-----BEGIN PRIVATE KEY-----\ny\n-----END PRIVATE KEY-----\n"
config:
  policy: {version: v7, rules: [{id: all, match: {topics: ["job.*"]}, decision: allow}]}
node:
  retention: 72h
  dlqRetention: 168h
  extraArgs: [--resend-after=10s]
serviceMonitor: {enabled: true, labels: {release: prom}}
worker: {enabled: true, replicaCount: 4, pool: echo, topics: [job.echo]}
`)
	d, c := deployment(t, o, "rel-troupe")
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 5 {
		t.Errorf("replicas = %v, want 5", d.Spec.Replicas)
	}
	args := checkArgs(t, c, "node")
	checkProbes(t, d, c, args, 9090)
	checkNonRoot(t, d, c)
	from := checkFiles(t, o, d, c, args)
	for flag, secret := range map[string]string{"redis-password-file": "rel-troupe-secrets", "nats-creds": "nats-creds",
		"sign-key": "rel-troupe-secrets", "verify-keys": "rel-troupe-secrets", "api-keys-file": "rel-troupe-secrets"} {
		if v := from[flag]; v == nil || v.Secret == nil || v.Secret.SecretName != secret {
			t.Errorf("--%s: want a file from Secret %s, got volume %+v", flag, secret, v)
		}
	}
	if from["policy"] == nil || from["policy"].ConfigMap == nil {
		t.Errorf("--policy: want a file from the ConfigMap, args %v", args["policy"])
	}
	if got := args["redis"]; len(got) != 3 || args["redis-cluster"] == nil {
		t.Errorf("--redis %v, --redis-cluster %v: want three addresses and the cluster flag", got, args["redis-cluster"])
	}
	want := map[string]string{"nats": "nats://n-0.nats:4222,nats://n-1.nats:4222", "stream-replicas": "3",
		"stream-max-bytes": "67108864", "retention": "72h", "dlq-retention": "168h", "resend-after": "10s", "id": "$(POD_NAME)"}
	for flag, v := range want {
		if got := args[flag]; len(got) != 1 || got[0] != v {
			t.Errorf("--%s = %v, want %s", flag, got, v)
		}
	}
	keys := string(o.Secrets["rel-troupe-secrets"].Data["api-keys"])
	if !strings.Contains(keys, "name=ops\nfedcba9876543210fedcba9876543210=acme") {
		t.Errorf("api-keys = %q: want the two entries, a line each", keys)
	}
	if got := string(o.Secrets["rel-troupe-secrets"].Data["redis-password"]); got != "s3cret" {
		t.Errorf("redis-password = %q", got)
	}
	// No secret reaches a pod spec: they are files from Secret volumes.
	for _, d := range o.Deployments {
		spec, _ := yaml.Marshal(d.Spec.Template)
		for _, secret := range []string{"s3cret", "0123456789abcdef0123456789abcdef", "BEGIN PRIVATE KEY"} {
			if strings.Contains(string(spec), secret) {
				t.Errorf("Deployment %s: the pod spec holds the secret %q", d.Name, secret)
			}
		}
	}

	sm, ok := o.ServiceMonitors["rel-troupe"]
	if !ok {
		t.Fatalf("no ServiceMonitor with serviceMonitor.enabled")
	}
	svc := o.Services["rel-troupe"]
	for k, v := range sm.Spec.Selector.MatchLabels {
		if svc.Labels[k] != v {
			t.Errorf("ServiceMonitor selects %s=%s; the Service has %q", k, v, svc.Labels[k])
		}
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != svc.Spec.Ports[0].Name || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor endpoints %+v: want /metrics on port %s", sm.Spec.Endpoints, svc.Spec.Ports[0].Name)
	}
	if sm.Labels["release"] != "prom" {
		t.Errorf("ServiceMonitor labels %v: want release=prom from the values", sm.Labels)
	}

	wd, wc := deployment(t, o, "rel-troupe-worker")
	if wd.Spec.Replicas == nil || *wd.Spec.Replicas != 4 {
		t.Errorf("worker replicas = %v, want 4", wd.Spec.Replicas)
	}
	wargs := checkArgs(t, wc, "worker")
	checkNonRoot(t, wd, wc)
	wfrom := checkFiles(t, o, wd, wc, wargs)
	if wfrom["nats-creds"] == nil || wfrom["sign-key"] == nil || wfrom["verify-keys"] == nil {
		t.Errorf("worker: want --nats-creds, --sign-key and --verify-keys mounted, args %v", wargs)
	}
	if got := strings.Join(wargs["pool"], ",") + " " + strings.Join(wargs["topics"], ","); got != "echo job.echo" {
		t.Errorf("worker --pool --topics = %q, want \"echo job.echo\"", got)
	}
	if svc.Spec.Selector["app.kubernetes.io/component"] != "node" {
		t.Errorf("the Service selects %v: it must not select the workers", svc.Spec.Selector)
	}
}

// TestChartExistingSecrets takes the API keys and the Redis password from
// Secrets the user made: the chart renders no Secret of its own and
// mounts the named keys.
func TestChartExistingSecrets(t *testing.T) {
	o := render(t, `
replicaCount: 1
apiKeys: {existingSecret: troupe-api, existingSecretKey: entries}
redis: {existingSecret: redis-auth, existingSecretPasswordKey: pw}
`)
	if len(o.Secrets) != 0 {
		t.Errorf("rendered Secrets %v, want none", keys(o.Secrets))
	}
	if len(o.PDBs) != 0 {
		t.Errorf("a PodDisruptionBudget for one replica")
	}
	d, c := deployment(t, o, "rel-troupe")
	args := checkArgs(t, c, "node")
	from := checkFiles(t, o, d, c, args)
	for flag, want := range map[string][2]string{"api-keys-file": {"troupe-api", "entries"}, "redis-password-file": {"redis-auth", "pw"}} {
		v := from[flag]
		if v == nil || v.Secret == nil || v.Secret.SecretName != want[0] || len(v.Secret.Items) != 1 || v.Secret.Items[0].Key != want[1] {
			t.Errorf("--%s from %+v, want key %s of Secret %s", flag, v, want[1], want[0])
		}
	}
	if strings.Contains(o.Notes, "generated") {
		t.Errorf("NOTES.txt speaks of a generated key with apiKeys.existingSecret")
	}
}

// TestChartRefuses checks that values the node cannot run with fail the
// render (the chart's checks or values.schema.json) with a message naming
// the value.
func TestChartRefuses(t *testing.T) {
	for values, want := range map[string]string{
		`redis: {urls: []}`:            "/redis/urls",
		`nats: {urls: []}`:             "/nats/urls",
		`signing: {enabled: true}`:     "signing.signKey",
		`config: {pools: null}`:        "config.pools",
		`replicas: 3`:                  "replicas",
		`admin: {port: "8080x"}`:       "/admin/port",
		`node: {retention: 3 days}`:    "/node/retention",
		`worker: {handler: crash}`:     "/worker/handler",
		`redis: {url: redis://r:6379}`: "url",
		`nats: {auth: {existingSecret: nats-auth, passwordKey: pw}}`: "nats.auth.user",
	} {
		var v map[string]any
		if err := yaml.Unmarshal([]byte(values), &v); err != nil {
			t.Fatal(err)
		}
		_, err := Render(chartDir, v)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("values %s: err %v, want one naming %s", values, err, want)
		}
	}
}

// TestArgCheckCatchesUnknownFlags makes sure the arg check itself bites:
// a flag the node does not have, and a value flag written without its
// value, are caught.
func TestArgCheckCatchesUnknownFlags(t *testing.T) {
	flags := realFlags(t, "node")
	for arg, want := range map[string]string{
		"--no-such-flag=1": "does not have",
		"--pools":          "takes a value",
		"pools=x":          "not a --flag",
	} {
		if got := checkFlag(flags, arg); !strings.Contains(got, want) {
			t.Errorf("checkFlag(%q) = %q, want %q", arg, got, want)
		}
	}
	for _, ok := range []string{"--log-json", "--redis-cluster", "--pools=/x", "--admin-listen=0.0.0.0:8080"} {
		if got := checkFlag(flags, ok); got != "" {
			t.Errorf("checkFlag(%q) = %q, want accepted", ok, got)
		}
	}
}
