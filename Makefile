# Tandem: the one entry point. CI runs the same targets (see .ci/run).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

# Offline and CPU-engine settings for everything run from here (../shared/docs/running-vllm-here.md).
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export VLLM_CPU_KVCACHE_SPACE ?= 1
export VLLM_CPU_OMP_THREADS_BIND ?= nobind
export VLLM_CACHE_ROOT ?= $(CURDIR)/.cache/vllm
export TANDEM_MODEL_CACHE ?= $(CURDIR)/.cache/models

PYTEST_ARGS ?=
# pytest-xdist workers for the unit suite: each starts its own session engine, so more workers
# cost memory as well as cores.
UNIT_WORKERS ?= 2
UNIT_PYTEST := $(PY) -m pytest tests/unit -n $(UNIT_WORKERS) --dist loadscope
BENCH_ARGS ?=

MODEL ?=
RENDER_PORT ?= 8100
RENDER_WORKERS ?=
GENERATE_PORT ?= 8200
# make run/demo: generate nodes behind the front door, on GENERATE_PORT and the ports after it.
GENERATE_NODES ?= 2
FRONT_PORT ?= 8000
# Engine options for the CPU build here; GPU users drop --enforce-eager and size things up.
ENGINE_ARGS ?= --enforce-eager --max-model-len 4096 --max-num-seqs 16

.PHONY: help setup models docs test test-unit test-integration test-families check fuzz soak chaos lint format bench bench-wire bench-render bench-generate bench-weights bench-front-door bench-stream run-render run-generate run demo clean

help:
	@echo "make run         render + $(GENERATE_NODES) generate nodes + the front door (one URL: 127.0.0.1:$(FRONT_PORT)); tiny model unless MODEL=...; runs the examples, serves until Ctrl-C"
	@echo "make demo        the same, but stop after the example"
	@echo "make setup       create/refresh $(VENV) (vLLM CPU build here, GPU build where nvidia-smi sees a GPU)"
	@echo "make test        set up if needed, lint, build the docs, then run the test suite (unit, then integration)"
	@echo "make test-families  every model family's tiny checkpoint against vllm serve: door, client and render parity (make test runs one of each kind)"
	@echo "make check       the inner loop, under 10 minutes: lint, the unit suite, one chat through render, generate and the door"
	@echo "make docs        build the documentation site into site/ (mkdocs build --strict: broken links fail)"
	@echo "make lint        ruff + mypy"
	@echo "make fuzz        the fuzzers' long form (TANDEM_FUZZ_COUNT mutants per route, 3000; TANDEM_SCHEMA_FUZZ_COUNT schemathesis examples per operation, 200)"
	@echo "make soak        render + generate + front door under saturating mixed load through the door (SOAK_SECONDS, 600); plot in .cache/soak"
	@echo "make chaos       render + 3 generate nodes + the front door under a seeded nemesis (kills, SIGSTOPs, partitions, cut updates) while TRL's weight updates and clients run; checks the fleet's invariants (CHAOS_SECONDS, 600; CHAOS_SEED, random and printed)"
	@echo "make models      build the tiny test models into .cache/models"
	@echo "make bench       the end-to-end report (under an hour): every comparison side by side, the front door vs vllm serve included -> docs/bench"
	@echo "make bench-wire  wire codec throughput and bytes: ours (JSON, binary, elided) vs vLLM's serde"
	@echo "make bench-render  render service vs upstream vllm launch render (throughput, CPU/request)"
	@echo "make bench-generate  render->generate vs upstream's pair and monolithic server (API CPU/request)"
	@echo "make bench-weights  weight updates (tiny model, synthetic 1 GB) vs a plain copy of the bytes"
	@echo "make bench-front-door  front door: proxied vs direct generate (CPU/MB, added p50); OpenAI chat vs vllm serve, one side at a time, vllm bench serve on both, each engine's CPU split into its work and vLLM's busy-wait"
	@echo "make bench-stream  the door's CPU per streamed token: generate's stream as SSE vs binary frames (in-process, no engine)"
	@echo "make run-render  serve render on 127.0.0.1:$(RENDER_PORT) (MODEL=... or the tiny Qwen2-VL)"
	@echo "make run-generate  serve generate on 127.0.0.1:$(GENERATE_PORT) (same model choice)"

# Every target goes through setup: tools/setup_env.py is idempotent and returns at once when the
# venv's stamp matches pyproject.toml, the script itself and the list of packages.
setup:
	$(PYTHON) tools/setup_env.py --venv $(VENV)

models: setup
	$(PY) -m tools.tiny_models

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The site is built strictly: a broken link, a missing page or anchor fails the build (and CI).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# Two sessions, unit then integration, both run whichever fails: the integration suite's shared
# fleet then never idles beside the unit suite, whose own engines have stopped before the fleet
# starts. The unit suite runs on UNIT_WORKERS workers, a module's tests on one (its engine and
# fixtures are shared): alone it keeps one core busy, the integration suite's processes keep
# both. Each session ends with its time per module (also in .cache/test-times/).
test: lint docs
	status=0; \
	$(MAKE) --no-print-directory test-unit || status=$$?; \
	$(MAKE) --no-print-directory test-integration || status=$$?; \
	exit $$status

# A -k that selects nothing in one session (pytest's exit 5) is no failure.
test-unit: setup
	$(UNIT_PYTEST) $(PYTEST_ARGS) || { rc=$$?; [ $$rc -eq 5 ] || exit $$rc; }

test-integration: setup
	$(PY) -m pytest tests/integration $(PYTEST_ARGS) || { rc=$$?; [ $$rc -eq 5 ] || exit $$rc; }

# Every family of tools/tiny_families against vllm serve on its tiny checkpoint (make test runs
# those marked in_make_test, one of each kind at least, within the suite's time budget).
test-families: setup
	TANDEM_ALL_FAMILIES=1 $(PY) -m pytest tests/integration/test_family_parity.py $(PYTEST_ARGS)

# The inner loop (under 10 minutes on two cores): lint, the unit suite, and one chat with an
# image through render, generate and the door with the OpenAI SDK.
check: lint
	status=0; \
	$(MAKE) --no-print-directory test-unit || status=$$?; \
	$(PY) -m pytest tests/integration/test_smoke.py $(PYTEST_ARGS) || status=$$?; \
	exit $$status

# The fuzz suites' long form (CI runs 150 mutants per route and 10 schema examples per operation
# and mode inside `make test`).
fuzz: setup
	TANDEM_FUZZ_COUNT=$${TANDEM_FUZZ_COUNT:-3000} TANDEM_SCHEMA_FUZZ_COUNT=$${TANDEM_SCHEMA_FUZZ_COUNT:-200} \
		$(PY) -m pytest -s tests/unit/generate/test_fuzz.py tests/unit/render/test_fuzz.py \
		tests/unit/wire/test_content_coding.py tests/unit/front/test_front_zstd.py \
		tests/integration/test_schema_fuzz.py $(PYTEST_ARGS)

# The soak's long form (CI runs a minute of the same mix inside `make test`): OpenAI chat, TRL's
# shape and tandem_client rollouts through the front door, a weight update a minute.
soak: setup
	$(PY) -m tools.soak --seconds $${SOAK_SECONDS:-600}

# The nemesis run's long form (CI runs 120 s of it inside `make test`): TRL's weight updates and
# greedy clients through the door and tandem_client while nodes are killed, stopped, cut off and
# their updates cut; a failing run prints its seed (CHAOS_SEED=... replays the same faults).
chaos: setup
	$(PY) -m tools.chaos --seconds $${CHAOS_SECONDS:-600} $${CHAOS_SEED:+--seed $$CHAOS_SEED}

# The report: payload, render, generate, rollout and scaling, ours beside upstream's servers
# started here; writes docs/bench/report.md, report.json and the PNG plots.
bench: setup models
	$(PY) -m tools.bench_report $(BENCH_ARGS)

bench-wire: setup
	$(PY) -m tools.bench_wire

bench-render: setup
	$(PY) -m tools.bench_render

bench-generate: setup
	$(PY) -m tools.bench_generate

bench-weights: setup
	$(PY) -m tools.bench_weights

bench-front-door: setup
	$(PY) -m tools.bench_front_door

bench-stream: setup
	$(PY) -m tools.bench_stream

# Without MODEL, the tiny Qwen2-VL test model is built (seconds) and served.
MODEL_DIR = "$${MODEL:-$$($(PY) -m tools.tiny_models qwen2-vl | tail -n 1)}"

run: setup
	$(PY) -m tools.run_stack $(if $(MODEL),--model "$(MODEL)") --engine-args "$(ENGINE_ARGS)" \
		--render-port $(RENDER_PORT) --generate-port $(GENERATE_PORT) --front-port $(FRONT_PORT) \
		--generate-nodes $(GENERATE_NODES)

demo: setup
	$(PY) -m tools.run_stack --demo $(if $(MODEL),--model "$(MODEL)") --engine-args "$(ENGINE_ARGS)" \
		--render-port $(RENDER_PORT) --generate-port $(GENERATE_PORT) --front-port $(FRONT_PORT) \
		--generate-nodes $(GENERATE_NODES)

run-render: setup
	$(PY) -m tandem_render --model $(MODEL_DIR) --port $(RENDER_PORT) \
		$(if $(RENDER_WORKERS),--workers $(RENDER_WORKERS))

run-generate: setup
	$(PY) -m tandem_generate --model $(MODEL_DIR) --port $(GENERATE_PORT) $(ENGINE_ARGS)

clean:
	rm -rf .cache .pytest_cache .mypy_cache .ruff_cache
