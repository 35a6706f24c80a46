# sbx — see README.md. `make run` and `make test` do all set-up themselves.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/sbxdev/sbx/internal/server.Version=$(VERSION) -X github.com/sbxdev/sbx/internal/agent.Version=$(VERSION) -X github.com/sbxdev/sbx/internal/mcp.Version=$(VERSION)
DATA_DIR ?= $(CURDIR)/.sbx/data
SBX_ADDR ?= 127.0.0.1:7777

.PHONY: all build deps run stop test test-k8s test-python test-ts test-ui test-unit lint check-gen check-ui ui screenshots bench soak fuzz clean

all: build

deps:
	@./scripts/install-deps.sh

build:
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/sbx-agent ./cmd/sbx-agent
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/sbx-userns-helper ./cmd/sbx-userns-helper
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/sbx ./cmd/sbx

# Start the daemon in the background (log in .sbx/daemon.log) and run the quickstart.
run: deps build
	@SBX_ADDR=$(SBX_ADDR) ./scripts/run.sh

stop:
	@./scripts/run.sh stop

lint: deps
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^api/gen/')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) mod tidy -diff
	cd api && $(GO) mod tidy -diff
	cd sdk/go && $(GO) mod tidy -diff
	$(GO) vet ./...
	cd api && $(GO) vet ./...
	cd sdk/go && $(GO) vet ./...
	./.tools/staticcheck ./...
	cd api && ../.tools/staticcheck ./execframe/...
	cd sdk/go && ../../.tools/staticcheck ./...
	@# The CLI and the SDK build on macOS too (the daemon and agent are Linux-only:
	@# their packages have _other.go stubs or linux build tags).
	GOOS=darwin $(GO) build ./...
	cd sdk/go && GOOS=darwin $(GO) build ./...

check-gen: deps
	@./scripts/check-gen.sh
	@./scripts/check-ui.sh

# The web dashboard (web/, Vite + TypeScript) is built into internal/ui/dist,
# which is committed and embedded in bin/sbx, so `go build` needs no npm;
# check-ui (part of check-gen) fails when it does not match web/'s sources.
ui:
	cd web && npm ci --no-audit --no-fund --loglevel=error && npm run -s build

check-ui:
	@./scripts/check-ui.sh

# The dashboard in headless chromium against a real daemon (Playwright).
test-ui: build
	env -u SBX_ADDR ./scripts/test-web-ui.sh

# Screenshots of every dashboard page into docs/ui/.
screenshots: build
	env -u SBX_ADDR SCREENSHOTS=$(CURDIR)/docs/ui ./scripts/test-web-ui.sh

test: deps build lint check-gen
	SBX_TEST_NETWORK_BUILD=1 SBX_TEST_DEBOOTSTRAP=1 $(GO) test -race -count=1 -timeout 25m ./...
	cd api && $(GO) test -race -count=1 ./...
	cd sdk/go && $(GO) test -race -count=1 ./...
	./scripts/test-go-sdk-consumer.sh
	FUZZTIME=3s ./scripts/fuzz.sh
	env -u SBX_ADDR ./scripts/test-python-sdk.sh
	env -u SBX_ADDR ./scripts/test-ts-sdk.sh
	env -u SBX_ADDR ./scripts/test-web-ui.sh

# The kubernetes runtime on a real single-node cluster built from the Go module proxy (scripts/k8s; the
# build is cached in K=/var/cache/sbx-k8s, a running healthy cluster is reused and left running).
test-k8s:
	./scripts/k8s/test.sh

test-python: build
	env -u SBX_ADDR ./scripts/test-python-sdk.sh

# The TypeScript SDK (sdk/ts): check-gen, npm pack, node --test on the tarball.
test-ts: build
	env -u SBX_ADDR ./scripts/test-ts-sdk.sh

test-unit:
	$(GO) test -count=1 ./...
	cd sdk/go && $(GO) test -count=1 ./...

# Every fuzz target for FUZZTIME each (one worker); a crash leaves its input
# under the package's testdata/fuzz/ to commit with the fix.
FUZZTIME ?= 60s
fuzz:
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

bench: deps build
	@./scripts/bench.sh

# The long crash loop: kill -9 the daemon N times under load (SOAK_ROUNDS,
# SOAK_CLIENTS, SOAK_MAX_BOXES, SOAK_DURATION, SOAK_SEED; see scripts/soak.sh).
soak:
	@./scripts/soak.sh

clean:
	rm -rf bin .tools
