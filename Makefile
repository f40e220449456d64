# The README's two commands:
#   make demo   set up Soft-RoCE (if no RDMA device) and run the examples and a short benchmark
#   make test   vet, host unit tests with -race, fuzzing, then every test binary inside Soft-RoCE,
#               then the two-host tests in two Soft-RoCE guests joined by a disturbable wire (make faults)
# Both do all set-up themselves (Debian packages, kernel, initramfs) via scripts/softroce.
#
# Steps of make test that need no RDMA device and no Soft-RoCE set-up (only a C
# compiler and the rdma-core headers, for the cgo packages):
#   make vet    go vet, gofmt, staticcheck (pinned in go.mod), errchain (errors keep
#               their chain: %w, never %v), go mod tidy -diff;
#               builds without cgo and for darwin and windows, and their exported API;
#               no build-history provenance in tracked files (scripts/check-provenance)
#   make unit   host unit tests with -race (tests that need RDMA skip on the host),
#               then again without cgo
#   make fuzz   each fuzz target for FUZZTIME inputs

SHELL := /bin/bash
GO ?= go
BUILD := .build
TESTS := $(BUILD)/tests
# Emulated Soft-RoCE is slow: tests stretch their timeouts by this factor.
export RDMA_TEST_TIMESCALE ?= 10
# An execution count, not a duration: with a duration Go 1.26's fuzz
# coordinator can fail a target with a bare "context deadline exceeded" when
# the time runs out under load (go.dev/issue/75804, fixed in Go 1.27).
# 500000 runs take about 10 s per target here. The targets that drive a
# whole receive path (a reader over a pipe, a connection's or a datagram
# socket's completion handling) run about ten times slower per input: they
# get FUZZTIME_PATH, about 10 s each too.
FUZZTIME ?= 500000x
FUZZTIME_PATH ?= 50000x
FUZZ_PATH_TARGETS := FuzzTCPFrames FuzzDatagramReceive FuzzRecvCompletion FuzzTransportFrames
# Build the Soft-RoCE test binaries with the race detector (GUEST_RACE=0 to turn off).
GUEST_RACE ?= 1
# Soak-like tests (long loops, many connections, timed stress): make soak runs
# them, make test leaves them out (-test.skip, which reports no SKIP line).
SOAK_TESTS := TestDialCycles|TestManyConnections|TestBidirectionalTransfer|TestDescriptorsAfterChurn|TestKeepaliveQuietWhileBusy|TestParkWakeStress
# Measurements, not checks: make setupbench runs TestSetupProfile.
MEASURE_TESTS := TestSetupProfile

.PHONY: setup build-deps test demo bench bench-grpc setupbench bench-2host vet unit fuzz rdma-tests test-matrix faults soak clean

# Everything: packages (qemu, rdma-core, perftest, ...), Debian's kernel, the initramfs.
setup:
	@scripts/softroce setup

# Only what compiling the cgo packages needs: checks that the C compiler finds
# the rdma-core headers and, as root, installs just libibverbs-dev and
# librdmacm-dev if it does not (otherwise it says which packages to install).
build-deps:
	@CC="$$($(GO) env CC)" scripts/softroce build-deps

# Systems the module must build for without cgo (no RDMA there): importing the
# package must never break a build. engine_stub.go stands in for the RDMA
# engine (files tagged linux && cgo) under the same public files.
NOCGO_GOOS := linux darwin windows

# Static checks; each fails the target with what to run to fix it.
vet: build-deps
	$(GO) vet ./...
	@# Builds without RDMA: CGO_ENABLED=0 on Linux, and darwin and windows.
	@set -e; for os in $(NOCGO_GOOS); do \
	  echo "GOOS=$$os CGO_ENABLED=0 $(GO) build ./... && $(GO) vet ./..."; \
	  GOOS=$$os CGO_ENABLED=0 $(GO) build ./... || { echo "FAIL: the module does not build for GOOS=$$os without cgo"; exit 1; }; \
	  GOOS=$$os CGO_ENABLED=0 $(GO) vet ./...; \
	done
	@# The public packages' exported API is the same in all of those builds.
	$(GO) run ./internal/apicheck -go $(GO)
	@unformatted=$$("$$($(GO) env GOROOT)/bin/gofmt" -l .); \
	if [ -n "$$unformatted" ]; then echo "FAIL: not gofmt'ed (run gofmt -w on them):"; echo "$$unformatted"; exit 1; fi
	$(GO) tool staticcheck ./...
	@# No error formatted into another without %w (internal/errchain).
	$(GO) run ./internal/errchain/cmd/errchain ./...
	@$(GO) mod tidy -diff || { echo "FAIL: go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }
	@# The data path's small helpers in other packages still inline.
	@GO=$(GO) scripts/check-inlining
	@# The tree speaks only of the library: no session or issue-number provenance.
	@scripts/check-provenance
	@# No built program is tracked.
	@scripts/check-binaries

unit: build-deps
	$(GO) test -race -count=1 ./...
	@# The build without cgo runs its own tests (unsupported_test.go: Dial and
	@# Listen fail with ErrNoDevice) and the shared ones; -race needs cgo.
	CGO_ENABLED=0 $(GO) test -count=1 ./...

fuzz: build-deps
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    t=$(FUZZTIME); case " $(FUZZ_PATH_TARGETS) " in *" $$f "*) t=$(FUZZTIME_PATH);; esac; \
	    echo "fuzz $$pkg $$f ($$t)"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $$t $$pkg; \
	  done; \
	done

# Build every package's test binary on the host (compiling inside the emulated
# guest is slow), run them all inside Soft-RoCE (but the two-host tests' and
# the static check's, HOST_ONLY_PKG), then check that no test was skipped and
# report the RDMA tests that ran.
rdma-tests: setup
	@rm -rf $(TESTS) && mkdir -p $(TESTS)
	@set -e; race=; [ "$(GUEST_RACE)" = 1 ] && race=-race; \
	$(GO) list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{.Dir}}{{end}}' ./... | \
	grep -v -e '^$(TWO_HOST_PKG) ' -e '^$(HOST_ONLY_PKG) ' | \
	while read -r pkg dir; do \
	  name=$$(echo "$${pkg#github.com/verbline/}" | tr / _); \
	  $(GO) test -c $$race -o $(TESTS)/$$name.test $$pkg; \
	  echo "$(CURDIR)/$(TESTS)/$$name.test $$dir" >>$(TESTS)/manifest; \
	done
	@echo "running $$(wc -l <$(TESTS)/manifest) test binaries inside Soft-RoCE"
	@# internal/rxebug reproduces an rxe bug by forcing retries with RNR NAKs:
	@# guest-tests leaves its RNR NAKs out of the check below.
	@RDMA_TEST_LOG=$(CURDIR)/$(TESTS)/rdma-tests.log GUEST_RNR_EXPECTED='^rdma_internal_rxebug$$' \
	  GUEST_TEST_ARGS='-test.skip ^($(SOAK_TESTS)|$(MEASURE_TESTS))$$' scripts/softroce run -- \
	  scripts/guest-tests $(CURDIR)/$(TESTS)/manifest $(CURDIR)/$(TESTS)
	@skipped=$$(grep -h -- '--- SKIP' $(TESTS)/*.out || true); \
	if [ -n "$$skipped" ]; then echo "FAIL: tests skipped inside Soft-RoCE:"; echo "$$skipped"; exit 1; fi
	@n=$$(sort -u $(TESTS)/rdma-tests.log 2>/dev/null | wc -l); \
	if [ "$$n" = 0 ]; then echo "FAIL: no RDMA test ran inside Soft-RoCE"; exit 1; fi; \
	echo "RDMA tests that ran inside Soft-RoCE ($$n):"; sort -u $(TESTS)/rdma-tests.log | sed 's/^/  /'
	@# iWARP has no RNR retry (a send that finds no receive ends the
	@# connection, which the suite would have seen) and siw no counters.
	@if [ "$${SOFTROCE_PROVIDER:-rxe}" = siw ]; then \
	  echo "Soft-iWARP: no RNR counters to check (iWARP has no RNR retry)"; \
	else \
	  test -s $(TESTS)/counters.txt || { echo "FAIL: no RNR counters read from the device"; exit 1; }; \
	  if awk '$$1 ~ /rnr/ && $$2 != 0 {bad=1} END {exit !bad}' $(TESTS)/counters.txt; then \
	    echo "FAIL: RNR retries happened (flow control let a send reach an unposted receive):"; \
	    cat $(TESTS)/counters.txt; exit 1; fi; \
	  echo "RNR counters of the device stayed at zero through the suite"; \
	fi

test: setup vet unit fuzz rdma-tests faults
	@echo "make test: PASS"

# The RDMA suite on other kernels and software providers (docs/testing.md,
# docs/devices.md): each MATRIX entry KERNEL/PROVIDER runs rdma-tests in a
# guest of that kind (SOFTROCE_KERNEL, SOFTROCE_PROVIDER), after make test's
# own run on 6.1/rxe. On Soft-iWARP (siw) every test that needs what the
# device lacks (immediates, windows, atomics, UD, the QP pool, RNR retry)
# asserts the documented outcome instead (docs/devices.md).
MATRIX ?= 6.12/rxe 6.1/siw 6.12/siw
test-matrix:
	@set -e; for m in $(MATRIX); do \
	  echo "=== test-matrix: Linux $${m%/*}, $${m#*/}"; \
	  SOFTROCE_KERNEL=$${m%/*} SOFTROCE_PROVIDER=$${m#*/} $(MAKE) --no-print-directory rdma-tests; \
	done
	@echo "make test-matrix: PASS ($(MATRIX))"

# The two-host tests (internal/faults; docs/reliability.md), the last step of make test:
# scripts/softroce pair boots two guests joined by a wire, runs twoguest-agent
# in guest B and the faults test binary in guest A, which starts its peers in
# B through the agent and disturbs the wire with tc netem. Fails if a test
# failed, skipped or did not run. FAULTS_ARGS go to the test binary (e.g.
# -test.run TestPartition, -faults.stream-mib 64); with them, only skips are
# checked, and that some test ran. The output ends with what failed (each
# failing test's last lines: scripts/guest-tests) or with the tests that ran.
TWO_HOST_PKG := github.com/verbline/rdma/internal/faults
# A static check's tests load packages with go list: they need no device,
# take over a minute under emulation, and run on the host with make unit.
HOST_ONLY_PKG := github.com/verbline/rdma/internal/errchain
FAULTS := $(BUILD)/faults
FAULTS_ARGS ?=
faults: setup
	@rm -rf $(FAULTS) && mkdir -p $(FAULTS)
	@race=; [ "$(GUEST_RACE)" = 1 ] && race=-race; \
	echo "$(GO) test -c $$race -o $(FAULTS)/faults.test ./internal/faults"; \
	$(GO) test -c $$race -o $(FAULTS)/faults.test ./internal/faults
	$(GO) build -o $(FAULTS)/twoguest-agent ./internal/rdmatest/twoguest/twoguest-agent
	@echo "$(CURDIR)/$(FAULTS)/faults.test $(CURDIR)/internal/faults" >$(FAULTS)/manifest
	@echo "running the two-host tests in two Soft-RoCE guests (scripts/softroce pair)"
	@GUEST_TEST_ARGS='$(FAULTS_ARGS)' RDMA_TEST_LOG=$(CURDIR)/$(FAULTS)/ran.log scripts/softroce pair \
	  --peer '$(FAULTS)/twoguest-agent' -- scripts/guest-tests $(CURDIR)/$(FAULTS)/manifest $(CURDIR)/$(FAULTS)
	@skipped=$$(grep -h -- '--- SKIP' $(FAULTS)/faults.out || true); \
	if [ -n "$$skipped" ]; then echo "FAIL: two-host tests skipped:"; echo "$$skipped"; exit 1; fi
	@if [ -z '$(FAULTS_ARGS)' ]; then \
	  missing=; for t in $$(cd internal/faults && $(CURDIR)/$(FAULTS)/faults.test -test.list '.*' | grep '^Test'); do \
	    grep -q -- "^--- PASS: $$t " $(FAULTS)/faults.out || missing="$$missing $$t"; \
	  done; \
	  if [ -n "$$missing" ]; then echo "FAIL: two-host tests that did not run:$$missing"; exit 1; fi; \
	fi
	@grep -q -- '^--- PASS' $(FAULTS)/faults.out || { echo "FAIL: no two-host test ran (FAULTS_ARGS: $(FAULTS_ARGS))"; exit 1; }
	@echo "two-host tests that ran:"; grep -h -- '^--- PASS' $(FAULTS)/faults.out | sed 's/^--- PASS: /  /'

# The examples and a short benchmark against perftest, built on the host and
# run in one boot of the Soft-RoCE guest (or on the host's device).
demo: setup
	@mkdir -p $(BUILD)/examples $(BUILD)/bin benchmarks/results
	$(GO) build -o $(BUILD)/examples/ ./examples/...
	$(GO) build -o $(BUILD)/bin/rdmabench ./benchmarks/cmd/rdmabench
	@scripts/softroce run -- bash -c 'set -e; \
	  for ex in $(BUILD)/examples/*; do echo "== $$ex"; $$ex; done; \
	  echo "== short benchmark (make bench runs the full one)"; \
	  $(BUILD)/bin/rdmabench -quick -json benchmarks/results/demo.json'

# The benchmark harness (benchmarks/README.md): our cases against perftest, TCP
# on loopback and the Go floor, in interleaved rounds inside one Soft-RoCE
# guest; paired ratios with 95% intervals and the goals' verdicts on the
# terminal, the JSON (every round) in $(BENCH_JSON) (a path under this
# directory: the guest writes only here) and an SVG chart beside it.
# BENCH_ARGS go to rdmabench (e.g. -long to decide a goal, -quick, -cases latency).
BENCH_JSON ?= benchmarks/results/bench.json
BENCH_ARGS ?=
bench: setup
	@mkdir -p $(BUILD)/bin $(dir $(BENCH_JSON))
	$(GO) build -o $(BUILD)/bin/rdmabench ./benchmarks/cmd/rdmabench
	scripts/softroce run -- $(BUILD)/bin/rdmabench -json $(BENCH_JSON) $(BENCH_ARGS)

# gRPC three ways in one guest (rdmabench -grpc; docs/performance.md, gRPC):
# grpcrdma, grpc-go over rdma.Conn and grpc-go over TCP serving one
# generated service, pinned and in interleaved rounds, with the message
# view's own stream of the same messages as the stream's ceiling: unary
# calls, 16 callers, a bidirectional stream of 256 KiB messages, and the
# goals' verdicts. BENCH_GRPC_ARGS go to rdmabench (e.g. -rounds 15).
BENCH_GRPC_JSON ?= benchmarks/results/bench-grpc.json
BENCH_GRPC_ARGS ?=
bench-grpc: setup
	@mkdir -p $(BUILD)/bin $(dir $(BENCH_GRPC_JSON))
	$(GO) build -o $(BUILD)/bin/rdmabench ./benchmarks/cmd/rdmabench
	scripts/softroce run -- $(BUILD)/bin/rdmabench -grpc -json $(BENCH_GRPC_JSON) $(BENCH_GRPC_ARGS)

# Connection set-up against rdma-core's cmtime on the same device
# (scripts/setupbench: paired rounds of SETUP_CONNS concurrent dials, the
# listener in the dialers' process and in its own; then unpaired rounds and
# sequential dials). SETUP_ARGS: environment for it, e.g. PAIRS=9 ROUNDS=3;
# TIMELINE=1 adds each connection's steps in the kernel's clock (needs perf).
SETUP_CONNS ?= 20
SETUP_LOG ?= benchmarks/results/setupbench-paired-$(SETUP_CONNS).log
setupbench: setup
	@mkdir -p $(BUILD) $(dir $(SETUP_LOG))
	$(GO) test -c -o $(BUILD)/setup.test .
	$(GO) build -o $(BUILD)/cmtimeline ./benchmarks/cmd/cmtimeline
	@set -o pipefail; env CMTIMELINE=$(BUILD)/cmtimeline $(SETUP_ARGS) scripts/softroce run -- scripts/setupbench $(SETUP_CONNS) $(BUILD)/setup.test | tee $(SETUP_LOG)

# The benchmark across two hosts (benchmarks/README.md, "Two hosts"): two
# Soft-RoCE guests of 1 vCPU each joined by a wire (scripts/softroce pair);
# guest B runs "rdmabench -listen" (control on eth1), guest A "rdmabench
# -connect" with every client side, perftest and TCP between the same two
# addresses (169.254.78.1 -> .2 on rxe0/eth0). The report (table, JSON, SVG)
# is written by guest A to $(BENCH2HOST_JSON). The two guests share the
# host's cores: read the rounds and their spread (the JSON's *_rounds).
BENCH2HOST_JSON ?= benchmarks/results/bench-2host.json
BENCH2HOST_ARGS ?= -quick -rounds 3 -lat-rounds 3 -lat-iters 100 -bw-bytes 4194304 -rate-msgs 5000
BENCH2HOST_PORT ?= 7471
bench-2host: setup
	@mkdir -p $(BUILD)/bin $(dir $(BENCH2HOST_JSON))
	$(GO) build -o $(BUILD)/bin/rdmabench ./benchmarks/cmd/rdmabench
	flock /tmp/softroce.lock scripts/softroce pair \
	  --peer '$(BUILD)/bin/rdmabench -listen $$SOFTROCE_CTL_ADDR:$(BENCH2HOST_PORT)' -- \
	  bash -c '$(BUILD)/bin/rdmabench -connect $$SOFTROCE_PEER_CTL_ADDR:$(BENCH2HOST_PORT) -json $(BENCH2HOST_JSON) $(BENCH2HOST_ARGS)'

# Soak runs, too long for make test (docs/performance.md quotes them): the
# SOAK_TESTS, inside Soft-RoCE, without the race detector (its cost would
# dominate). SOAK_CYCLES sequential dial/echo/close cycles while a long-lived
# connection holds the device, SOAK_CONNS concurrent connections,
# SOAK_TRANSFER_MIB each way at once on one connection and SOAK_FD_CYCLES
# cycles counting rdma_cm descriptors; the keepalive and park/wake stress
# tests run for their own fixed time. A quick pass with the tests' own
# defaults (about 3 minutes): make soak SOAK_CYCLES=400 SOAK_CONNS=1000
# SOAK_TRANSFER_MIB=64 SOAK_FD_CYCLES=200. Fails if a test failed or skipped.
SOAK_CYCLES ?= 10000
SOAK_CONNS ?= 1000
SOAK_TRANSFER_MIB ?= 1024
SOAK_FD_CYCLES ?= 1000
soak: setup
	@mkdir -p $(BUILD)
	$(GO) test -c -o $(BUILD)/soak.test .
	@set -o pipefail; RDMA_TEST_CYCLES=$(SOAK_CYCLES) RDMA_TEST_CONNS=$(SOAK_CONNS) RDMA_TEST_TRANSFER_MIB=$(SOAK_TRANSFER_MIB) RDMA_TEST_FD_CYCLES=$(SOAK_FD_CYCLES) scripts/softroce run -- \
	  $(BUILD)/soak.test -test.v -test.count=1 -test.timeout=150m -test.run '^($(SOAK_TESTS))$$' | \
	  tee $(BUILD)/soak.out
	@! grep -- '--- SKIP' $(BUILD)/soak.out || { echo "FAIL: soak tests skipped"; exit 1; }
	@echo "make soak: PASS"

clean:
	rm -rf $(BUILD)
