# weft: the targets CI and people use. `make test` is the README's test
# command and what .ci/run runs.
GO        ?= go
PKGS      ?= ./...
TESTFLAGS ?=
BENCH     ?= .
BENCHTIME ?= 1s

.PHONY: test lint bench fuzz tidy build demo

test:
	$(GO) test -race -count=1 $(TESTFLAGS) $(PKGS)

build:
	$(GO) build -o bin/ ./cmd/master ./cmd/worker ./cmd/weft-demo

# A local cluster (master, 2 event writers, 2 workers) under a mixed load
# for 20 s, then a consistency check. Needs Redis and PostgreSQL running:
# `bash .ci/run` installs and starts them on Debian.
demo: build
	./bin/weft-demo -bin bin

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -benchmem $(PKGS)

# Each fuzz target for a short while: crashers are saved under testdata/fuzz.
FUZZTIME ?= 10s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParseToken$$' -fuzztime $(FUZZTIME) ./streams/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./fabric/wire/

tidy:
	$(GO) mod tidy
