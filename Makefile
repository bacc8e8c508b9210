# The two commands: `make demo` and `make test`. Each installs what is missing (Debian packages),
# configures a Release build with all cores, then runs the demo or the whole test suite.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test check test-torch2 bench format tidy check-size clean fuzz fuzz-build fuzz-smoke

all: build

deps:
	@tools/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The demo builds only what it runs: loom and its LibTorch half, not the tests and benchmarks.
demo: configure
	@cmake --build $(BUILD) -j $(JOBS) --target loom
	@$(BUILD)/tools/loom demo

# After the tests, the style checks: clang-tidy's findings and the sizes of files and functions.
test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	@$(MAKE) --no-print-directory fuzz-smoke
	@$(MAKE) --no-print-directory tidy
	@$(MAKE) --no-print-directory check-size

# The fast loop after a change: the LibTorch-free half (profiles, costmodel, planner, lab and the
# planning commands) built in $(LITE) and its library tests, then the size check; no LibTorch, no
# clang-tidy, and not test_tools (its end-to-end runs need loom-torch). make test is the whole check.
LITE ?= build-lite
check: deps
	@cmake -S . -B $(LITE) -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_WITH_TORCH=OFF $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(LITE) -j $(JOBS)
	@cd $(LITE) && ctest --output-on-failure -j $(JOBS) -E '^test_tools:'
	@$(MAKE) --no-print-directory check-size

# The same build and tests against LibTorch 2.x (Debian 13's 2.6, in a debootstrapped root; needs
# root and the Debian mirror; not part of make test or CI).
test-torch2:
	@tools/check-torch2.sh

bench: build
	@$(BUILD)/bench/bench_estimate
	@$(BUILD)/bench/bench_search
	@BUILD=$(BUILD) bench/published.sh | tail -n 12
	-@BUILD=$(BUILD) bench/train_vs_python.sh  # needs python3-torch; skipped with a hint otherwise

# Fuzzing: libFuzzer + ASan/UBSan with clang, every reader, FUZZ_SECONDS each. Built at -O1 with
# line tables only, as OSS-Fuzz builds its sanitizer targets: a quarter faster to compile than -O2
# with full debug information, and a crash's stack still names file and line.
FUZZ_SECONDS ?= 600
fuzz-build: deps
	@cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -fno-omit-frame-pointer -DNDEBUG" \
	  -DLOOM_BUILD_FUZZERS=ON -DLOOM_WITH_TORCH=OFF -DLOOM_BUILD_TESTS=OFF >/dev/null
	@cmake --build build-fuzz --target fuzz_model_json fuzz_hf_config fuzz_cluster_json \
	  fuzz_plan_json fuzz_safetensors fuzz_vocab fuzz_bpe_vocab fuzz_csv fuzz_profile_json

fuzz: fuzz-build
	@tools/run-fuzzers.sh build-fuzz $(FUZZ_SECONDS)

# What CI runs of it (part of make test): 20,000 inputs per target from a fixed seed.
fuzz-smoke: fuzz-build
	@FUZZ_RUNS=20000 tools/run-fuzzers.sh build-fuzz 0

format:
	@git ls-files '*.cpp' '*.hpp' | xargs clang-format -i

# Every finding of .clang-tidy is an error; the files are checked JOBS at a time. The LibTorch-free
# sources only: Debian's clang-tidy 14 cannot parse LibTorch 1.13's headers with GCC 12's library
# (c10::IValue is incomplete), and each such file takes minutes, so the commands built into
# loom-torch are left out.
TIDY_SKIP := tools/(train|profile|logits|demo|export)_command\.cpp
tidy: configure
	@git ls-files 'profiles/*.cpp' 'costmodel/*.cpp' 'planner/*.cpp' 'lab/*.cpp' 'tools/*.cpp' | \
	  grep -Ev '^$(TIDY_SKIP)$$' | \
	  xargs -P $(JOBS) -n 1 tools/tidy-one.sh $(BUILD)

# No source file over 800 lines, no function over 150 (tools/check-size.sh).
check-size:
	@tools/check-size.sh

clean:
	@rm -rf $(BUILD)
