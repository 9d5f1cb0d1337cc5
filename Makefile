# Troupe — build, run and test.
#
#   make run    the whole system in one process, no outside services
#   make test   vet + every test (real Redis/NATS when reachable, embedded otherwise)
#   make soak   the decision core's simulator, ≥ 50 M steps over many seeds
#   make image  the container image (deploy/Dockerfile)

GO            ?= go
# go.mod's toolchain line names the Go release the node is built and tested
# with (one without reachable standard-library vulnerabilities, see
# `make vulncheck`); auto lets an older local Go fetch it through the module
# proxy. Set GOTOOLCHAIN=local to build with whatever Go is installed.
export GOTOOLCHAIN ?= auto
PROTOC        ?= protoc
# Generator versions are pinned so `make proto` is reproducible.
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.5.1
GOBIN         := $(shell $(GO) env GOPATH)/bin

.PHONY: run test test-chart image test-faults test-embedded fuzz-short vet build proto proto-tools bench bench-smoke fmt vulncheck soak

build:
	$(GO) build ./...

run:
	$(GO) run ./cmd/troupe dev

vet:
	$(GO) vet ./...

test: vet test-chart
	$(GO) test -race -count=1 -timeout 15m -tags conformance ./...

# The Helm chart (deploy/helm/troupe) rendered with Helm's Go packages and
# its objects decoded strictly into the Kubernetes API types, against the
# flags of a troupe binary built from this checkout. A module of its own,
# so Helm stays out of the node's go.mod.
test-chart:
	cd deploy/helm/charttest && $(GO) vet ./... && $(GO) test -count=1 -timeout 10m ./...

# The container image: a static binary (no cgo, -trimpath) built here and
# the build host's CA bundle, FROM scratch, run as uid 65532. Nothing is
# pulled. `docker run --rm $(IMAGE) version` shows what it holds.
IMAGE     ?= troupe:dev
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
image:
	rm -rf bin/image && mkdir -p bin/image
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=auto -ldflags='-s -w' -o bin/image/troupe ./cmd/troupe
	cp $(CA_BUNDLE) bin/image/ca-certificates.crt
	docker build -f deploy/Dockerfile -t $(IMAGE) .

# The fault suite: three `troupe node` processes, two workers, private
# redis-server / nats-server / safety kernel; 10,000 jobs per scenario while
# a node, Redis, NATS, a worker or the kernel breaks (RELIABILITY.md). Then
# the process fault tests of a few hundred jobs each (worker or node paused,
# a worker paused with free slots, FLUSHALL, a worker killed with started
# jobs, a stock worker killed, a node and a worker killed together, NATS
# paused 90 s, streams deleted mid-deletion; about 10 minutes, whatever
# FAULTS_JOBS says); then the lock renewer under a flooded Writer (alone:
# it floods its Redis).
FAULTS_JOBS ?= 10000
test-faults:
	TROUPE_FAULTS=1 TROUPE_FAULTS_JOBS=$(FAULTS_JOBS) $(GO) test -count=1 -timeout 30m -v -run 'TestFaultSuite|TestFault(Worker|Node|Flushall|Stock|NATS|StreamDeletedMidDeletion)' ./faults/
	TROUPE_FAULTS=1 $(GO) test -count=1 -timeout 5m -v -run '^TestRenewerKeepsLocksWhileTheWriterIsFlooded$$' ./internal/store/

# The end-to-end tests again, against the in-process NATS server and the
# embedded Redis-protocol store, as on a machine with no services.
test-embedded:
	TROUPE_TEST_REDIS=embedded TROUPE_TEST_NATS=embedded $(GO) test -count=1 -timeout 10m . ./internal/bench/... ./internal/connect/... ./internal/logx/... ./internal/metricsx/... ./internal/testenv/... ./internal/store/...

# The decision core's simulator over a long range of seeds, one per CPU at
# once: at least SOAK_STEPS simulated steps (seeds from SOAK_FIRST upward),
# printing seeds, steps, steps/s and violations; fails on any violation.
# `make test` runs 170 seeds (~1.1 M steps) and the named regressions.
SOAK_STEPS ?= 50000000
SOAK_FIRST ?= 1000000
soak:
	TROUPE_SIM_SOAK_STEPS=$(SOAK_STEPS) TROUPE_SIM_SOAK_FIRST=$(SOAK_FIRST) $(GO) test -count=1 -timeout 30m -v -run '^TestSimSoak$$' ./internal/lifecycle/

# Troupe and the floor (same traffic, no scheduling logic) in one invocation;
# adds rows to BENCHMARKS.md. See BENCHMARKS.md for the other runs.
# A few seconds of each fuzz target (CI); run one longer with e.g.
#   go test -run '^$$' -fuzz FuzzDecodeAndValidate -fuzztime 10m ./internal/intake/
# The budget is a count of executions, not a duration: with a duration, Go
# 1.26's fuzz coordinator can fail a target at the deadline with "context
# deadline exceeded" and no crasher (golang/go#75804, fixed in Go 1.27).
FUZZTIME ?= 20000x
fuzz-short:
	$(GO) test -run '^$$' -fuzz FuzzDecodeAndValidate -fuzztime $(FUZZTIME) ./internal/intake/
	$(GO) test -run '^$$' -fuzz FuzzDecodeIsProtoUnmarshal -fuzztime $(FUZZTIME) ./internal/bus/
	$(GO) test -run '^$$' -fuzz FuzzParsePools -fuzztime $(FUZZTIME) ./internal/router/
	$(GO) test -run '^$$' -fuzz FuzzDecodePeerLoad -fuzztime $(FUZZTIME) ./internal/router/
	$(GO) test -run '^$$' -fuzz FuzzParseTimeouts -fuzztime $(FUZZTIME) ./internal/jobactor/
	$(GO) test -run '^$$' -fuzz FuzzPolicyEngine -fuzztime $(FUZZTIME) ./safety/
	$(GO) test -run '^$$' -fuzz FuzzRequestBodies -fuzztime $(FUZZTIME) ./internal/admin/

bench:
	$(GO) run ./cmd/troupe-bench --compare

# The bench harness's correctness smoke (all jobs SUCCEEDED, none received
# twice; never a timing assertion), against the real servers and then the
# embedded ones.
bench-smoke:
	$(GO) test -race -count=1 -run TestBenchSmoke ./internal/bench/
	TROUPE_TEST_REDIS=embedded TROUPE_TEST_NATS=embedded $(GO) test -race -count=1 -run TestBenchSmoke ./internal/bench/

fmt:
	gofmt -w $$(git ls-files '*.go' | grep -v '\.pb\.go$$')

proto-tools:
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

# Regenerates proto/capv1 from proto/*.proto (needs protoc: Debian's protobuf-compiler).
proto: proto-tools
	PATH="$(GOBIN):$$PATH" $(PROTOC) -I proto \
		--go_out=proto --go_opt=module=github.com/troupe-run/troupe/proto \
		--go-grpc_out=proto --go-grpc_opt=module=github.com/troupe-run/troupe/proto \
		proto/cap.proto proto/safety.proto

# govulncheck over the module, with go.mod's toolchain (GOTOOLCHAIN=auto
# fetches it through the module proxy), failing on any reachable finding
# (govulncheck exits 3). The database is built locally from the OSV files
# of golang.org/x/vulndb, fetched through the Go module proxy like any
# module, with that repository's own indexer (cmd/indexdb): vuln.go.dev
# need not be reachable. Bump VULNDB_VERSION (`go list -m
# golang.org/x/vulndb@latest`) for newer reports; VULNDB=https://vuln.go.dev
# uses the live database instead where it is reachable.
VULNCHECK_VERSION ?= v1.9.0
VULNDB_VERSION    ?= v0.0.0-20261105234957-e22db6528018
VULNDB_DIR        ?= $(CURDIR)/.vulndb/$(VULNDB_VERSION)
VULNDB            ?= file://$(VULNDB_DIR)
vulncheck:
	@set -e; if [ "$(VULNDB)" = "file://$(VULNDB_DIR)" ] && [ ! -f "$(VULNDB_DIR)/index/db.json" ]; then \
	  src=$$($(GO) mod download -json golang.org/x/vulndb@$(VULNDB_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
	  test -n "$$src" || { echo "vulncheck: golang.org/x/vulndb@$(VULNDB_VERSION) not downloadable (module proxy unreachable?)"; exit 1; }; \
	  echo "vulncheck: building the database from $$src/data/osv"; \
	  rm -rf "$(VULNDB_DIR).tmp"; \
	  (cd "$$src" && GOFLAGS=-mod=mod GOTOOLCHAIN=auto $(GO) run ./cmd/indexdb -vulns data/osv -out "$(VULNDB_DIR).tmp"); \
	  mv "$(VULNDB_DIR).tmp" "$(VULNDB_DIR)"; \
	fi
	GOTOOLCHAIN=auto $(GO) version
	GOTOOLCHAIN=auto $(GO) run golang.org/x/vuln/cmd/govulncheck@$(VULNCHECK_VERSION) -db $(VULNDB) ./...
