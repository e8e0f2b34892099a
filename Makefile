# weft: the targets CI and people use. `make test` is the README's test
# command and what .ci/run runs.
#
# The repository is four modules tied by go.work: the library at the root
# (what a user's go.mod requires), and cmd (the binaries, the benchmark
# harness and the tools), test (the suite that runs the binaries) and
# deploy (the deploy files' tests) beside it. Every target runs in the
# workspace, over the packages of all four.
GO        ?= go
MODULES   := . cmd test deploy bench/consumers
PKGS      ?= ./... ./cmd/... ./test/... ./deploy/...
TESTFLAGS ?=
BENCH     ?= .
BENCHTIME ?= 1s

.PHONY: test test-times test-cpu flake-hunt lint deps bench bench-quick bench-doc bench-scale bench-scale-smoke peers peers-consumers peers-consumers-smoke gobench fuzz fuzz-ci chaos tidy build demo compose-test

# .ci/gotest runs the suite: the binaries the tests run built once and
# shared by every package (WEFT_TEST_BIN), the private PostgreSQL clusters
# copied from one initdb made (WEFT_TEST_PG_TEMPLATE); ./test (whole clusters of the
# real binaries, each on private servers) in the background from the
# start, as the longest package, in two processes side by side: its tests
# that bound a time one at a time, and those that bound none
# E2E_PARALLEL at a time at nice E2E_NICE; every other package with -race, TEST_P
# at a time, since most wait on their own servers; then the tests -race
# would skip or slow too much (allocation counts, a heap bound, the
# simulations' full 10,000 and 2,000 seeds). Tests do not assert how fast
# the machine is, so they may share it (docs/TESTING.md, "Flaky tests").
E2E       ?= ./test
TEST_P    ?= 4
E2E_PARALLEL ?= 1
E2E_NICE  ?= 5
NORACE    ?= 1
GOTEST    = GO='$(GO)' PKGS='$(PKGS)' E2E='$(E2E)' TESTFLAGS='$(TESTFLAGS)' TEST_P='$(TEST_P)' E2E_PARALLEL='$(E2E_PARALLEL)' E2E_NICE='$(E2E_NICE)' NORACE='$(NORACE)'
test:
	$(GOTEST) .ci/gotest

# The suite as `make test` runs it, then a table of where its time went,
# per package, and any failed test with its output (cmd/weft-testrun:
# go test -json summarised; the go test -json stays in TIMES_DIR).
# docs/TESTING.md keeps the last table.
test-times:
	d=$${TIMES_DIR:-$$(mktemp -d /tmp/weft-times-XXXXXX)}; \
	$(GOTEST) JSON_DIR="$$d" .ci/gotest; s=$$?; \
	cat "$$d"/*.json | $(GO) run ./cmd/weft-testrun times; \
	[ $$s -eq 0 ] || cat "$$d"/*.json | $(GO) run ./cmd/weft-testrun failures; \
	echo "go test -json in $$d"; exit $$s

# make test with Linux's process accounting on (root, Debian's acct), then
# the CPU by test binary, each with the processes it started.
test-cpu:
	@command -v accton >/dev/null && command -v dump-acct >/dev/null || { echo "make test-cpu: needs accton and dump-acct (apt-get install acct), as root"; exit 1; }
	f=$$(mktemp /tmp/weft-acct-XXXXXX); accton "$$f" || exit 1; \
	$(GOTEST) .ci/gotest; s=$$?; accton off; \
	dump-acct "$$f" | $(GO) run ./cmd/weft-testrun cpu -top 25; \
	echo "process accounting in $$f"; exit $$s

# The suite FLAKE_N times (3) under as many busy loops as cores, then each
# failing test with its output (.ci/flake-hunt; PKGS, E2E and NORACE=0
# narrow it).
FLAKE_N   ?= 3
flake-hunt:
	$(GOTEST) FLAKE_N='$(FLAKE_N)' .ci/flake-hunt

# The chaos scenarios in their long form (more cycles, more load, longer
# faults), 200,000 seeds of the handover simulation, the heap bound with
# 60 KiB messages, the consumer groups' chaos
# (four rounds), 10,000 seeds of their simulation and the consumer oracle.
chaos:
	WEFT_CHAOS=long $(GO) test -count=1 -timeout 120m -run '^(TestChaos|TestRollingRestart|TestRedisOutageDegraded|TestReplayedChannel)' -v ./test/
	WEFT_SIM_SEEDS=200000 $(GO) test -count=1 -timeout 60m -run '^TestSimulation$$' -v ./internal/shard/handover/
	WEFT_CHAOS=long $(GO) test -count=1 -run '^TestServerHeapBounded$$' -v ./internal/shard/
	WEFT_CHAOS=long $(GO) test -count=1 -timeout 30m -run '^TestMailerChaos$$' -v ./examples/mailer/
	WEFT_SIM_SEEDS=10000 $(GO) test -count=1 -timeout 30m -run '^TestSimulation$$' -v ./internal/group/
	WEFT_CHAOS=long $(GO) test -count=1 -timeout 20m -run '^TestConsumerOracle$$' -v .

# deploy/'s compose files on a real Docker engine, as a user runs them, with
# Redis, a writer and a reader killed or stopped under load (deploy/README.md,
# "Run it on a real engine"). As root on Debian: it installs and starts
# what is missing (docker.io, the compose plugin, stand-in base images
# from Debian packages); the first run takes about 30 minutes on 2 busy
# cores, later ones about 6. Fails, never skips, when something is missing.
compose-test:
	WEFT_COMPOSE_TEST=1 $(GO) test -count=1 -v -timeout 120m ./deploy/enginetest/

# The revision is linked in, so --version and /status name it even where
# GOFLAGS has -buildvcs=false (the go command then stamps none).
REVISION  ?= $(shell git rev-parse HEAD 2>/dev/null)
build:
	$(GO) build -ldflags "-X github.com/weft-dev/weft/cmd/internal/server.linkRevision=$(REVISION)" -o bin/ ./cmd/master ./cmd/worker ./cmd/weft-demo

# A local cluster (master, 2 event writers, 2 workers) under a mixed load
# for 20 s, then a consistency check. On the local Redis and PostgreSQL,
# or, where none answers, private ones started from the installed
# binaries and removed after (`bash .ci/run` installs them on Debian).
demo: build
	./bin/weft-demo -bin bin

# staticcheck is pinned in cmd/go.mod (the tool directive; the workspace
# makes it runnable from here): no network beyond the module proxy, the
# same version everywhere.
# bench/consumers (a module of its own, out of `make test`) is linted too.
LINT_PKGS := $(PKGS) ./bench/consumers/...
lint: deps
	@out=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(LINT_PKGS)
	$(GO) tool staticcheck $(LINT_PKGS)

# The library module stays lean: what a user's build downloads is the
# root module's graph, so it holds pgx, go-redis, backoff, client_golang
# and what they need, plus test-only modules; the binaries' and tools'
# requirements (kong, progressbar, gonum, compose-go, staticcheck) live
# in the nested modules. Read without the workspace, as a user's build
# reads it.
DEPS_MAX  := 60
DEPS_DENY := alecthomas/kong|schollz/progressbar|gonum.org|compose-spec|honnef.co|pressly/goose
deps:
	@n=$$(GOWORK=off $(GO) list -m all | wc -l); \
	if [ "$$n" -gt $(DEPS_MAX) ]; then echo "deps: the root module lists $$n modules (go list -m all), over $(DEPS_MAX)"; exit 1; fi; \
	bad=$$(GOWORK=off $(GO) mod graph | grep -E '$(DEPS_DENY)'); \
	if [ -n "$$bad" ]; then echo "deps: the root module's graph reaches what belongs in a nested module:"; echo "$$bad"; exit 1; fi; \
	echo "deps: the root module lists $$n modules"

# The benchmark harness: weft against raw Redis/PostgreSQL in one run,
# median of 3; writes bench/results.json and regenerates docs/BENCHMARKS.md.
# bench/cluster.sh starts a private Redis Cluster beside it, for the
# per-stream measurement's sharded pub/sub rows.
bench:
	bench/cluster.sh $(GO) run ./cmd/weft-bench

# A short pass of the same harness (under 2 minutes); writes nothing.
bench-quick:
	$(GO) run ./cmd/weft-bench -quick

# docs/BENCHMARKS.md (and bench/chart.png) from the committed results and
# the peers' pass, measuring nothing.
bench-doc:
	$(GO) run ./cmd/weft-bench -render bench/results.json

# The scale curves (readers, streams, instances, long-polls, backlog,
# writers), each in one run, on a private redis-server: writes
# bench/scale.json and regenerates docs/SCALING.md and docs/scaling/*.png.
# About 25 minutes on 2 cores; -smoke runs each curve's smallest point
# (under 2 minutes, writes only to a temp dir; CI runs it).
bench-scale:
	$(GO) run ./cmd/weft-bench scale
bench-scale-smoke:
	$(GO) run ./cmd/weft-bench scale -smoke

# weft beside raw INSERT+PUBLISH, centrifuge and watermill
# (../shared/peerbench, on private servers; needs root for initdb):
# the lines every peer runs alike, one pass; REPS=3 for three. Writes
# bench/peers/results.jsonl and regenerates docs/BENCHMARKS.md from it.
peers:
	bench/peers/run.sh start
	SET=headline REPS=$${REPS:-1} bench/peers/run.sh all; s=$$?; bench/peers/run.sh stop; exit $$s
	$(MAKE) bench-doc

# weft's Consumer and groups beside River, NATS JetStream and a raw
# SELECT ... FOR UPDATE SKIP LOCKED loop (bench/consumers, a module of its
# own: the library's go.mod stays lean), on private PostgreSQL, Redis and
# nats-server (needs root for initdb): 3 interleaved passes (PASSES),
# about 25 minutes on 2 shared cores. Writes bench/consumers/results.jsonl,
# results.md and section.md, then regenerates docs/BENCHMARKS.md.
# The smoke: the verifier's unit test, then one short pass of every peer
# and scenario (1-4 minutes), writing nothing; it fails when weft or the
# raw loop breaks its promise (River and JetStream are reported only:
# River leaves a killed worker's jobs running until it rescues them).
peers-consumers:
	GO='$(GO)' bench/consumers/run.sh -passes $${PASSES:-3}
	$(MAKE) bench-doc
peers-consumers-smoke:
	$(GO) test -count=1 ./bench/consumers/
	GO='$(GO)' bench/consumers/run.sh -quick -strict weft,raw

# Every Go micro-benchmark in the tree.
gobench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -benchmem $(PKGS)

# Every fuzz target in the tree, FUZZTIME each: crashers are saved under
# testdata/fuzz, to commit as regression entries. CI runs `make fuzz-ci`
# after the tests; fuzz longer with `make fuzz FUZZTIME=3000000x`.
# The budget is a count of executions, not a duration: go1.26's fuzz
# coordinator can fail a duration budget at its deadline with a bare
# "context deadline exceeded" and no crasher (golang/go#75804, fixed in
# go1.27); a count has no deadline to race. 30000x is 1-7 s per target here.
FUZZTIME ?= 30000x
fuzz: fuzz-ci
fuzz-ci:
	$(GO) test -run '^$$' -fuzz '^FuzzParseToken$$' -fuzztime $(FUZZTIME) ./internal/streams/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./internal/fabric/wire/
	$(GO) test -run '^$$' -fuzz '^FuzzCore$$' -fuzztime $(FUZZTIME) ./internal/fabric/core/
	$(GO) test -run '^$$' -fuzz '^FuzzReplay$$' -fuzztime $(FUZZTIME) ./internal/fabric/core/
	$(GO) test -run '^$$' -fuzz '^FuzzValid$$' -fuzztime $(FUZZTIME) ./internal/jsonscan/
	$(GO) test -run '^$$' -fuzz '^FuzzValid$$' -fuzztime $(FUZZTIME) ./internal/sqlident/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodePage$$' -fuzztime $(FUZZTIME) ./internal/catchup/
	$(GO) test -run '^$$' -fuzz '^FuzzReadPage$$' -fuzztime $(FUZZTIME) ./internal/catchup/
	$(GO) test -run '^$$' -fuzz '^FuzzUpdatesParams$$' -fuzztime $(FUZZTIME) ./internal/catchup/
	$(GO) test -run '^$$' -fuzz '^FuzzSyncParams$$' -fuzztime $(FUZZTIME) ./internal/rooms/
	$(GO) test -run '^$$' -fuzz '^FuzzPathParams$$' -fuzztime $(FUZZTIME) ./internal/rooms/
	$(GO) test -run '^$$' -fuzz '^FuzzFrame$$' -fuzztime $(FUZZTIME) ./internal/faultproxy/
	$(GO) test -run '^$$' -fuzz '^FuzzPGMessages$$' -fuzztime $(FUZZTIME) ./internal/faultproxy/

# Each module tidied on its own (GOWORK=off), as its users' builds read it.
tidy:
	for m in $(MODULES); do (cd $$m && GOWORK=off $(GO) mod tidy) || exit 1; done
