# weft: the targets CI and people use. `make test` is the README's test
# command and what .ci/run runs.
GO        ?= go
PKGS      ?= ./...
TESTFLAGS ?=
BENCH     ?= .
BENCHTIME ?= 1s

.PHONY: test lint bench fuzz tidy

test:
	$(GO) test -race -count=1 $(TESTFLAGS) $(PKGS)

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
