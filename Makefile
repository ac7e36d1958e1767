# batchwise: the README's two commands are `make demo` and `make test`; the rest are their steps.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ONNX := model_repository/minilm/1/model.onnx
PYTEST_ARGS ?=

.PHONY: help venv export demo serve test test-unit bench clean

help:
	@echo "make demo    set up, export the models, start the embedded Triton, send real requests"
	@echo "make test    set up and run the whole test suite (unit and integration)"
	@echo "make serve   run the embedded Triton on 127.0.0.1:8000 (HTTP), 8001 (gRPC), 8002 (metrics)"
	@echo "make bench   benchmarks -> bench_results/*.json (figures and commands: BENCHMARKS.md)"

$(STAMP): pyproject.toml scripts/requirements.py
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), f"Python 3.11 is needed, {sys.executable} is {sys.version.split()[0]}"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $$($(PY) scripts/requirements.py --extras export,test)
	$(PY) -m pip install --quiet --no-deps $$($(PY) scripts/requirements.py --no-deps)
	@touch $(STAMP)

venv: $(STAMP)

DECODER := model_repository/gpt2/1

export: venv
	$(PY) scripts/export_onnx.py --skip-if-current
	$(PY) scripts/make_decoder_weights.py --output $(DECODER) --skip-if-current
	ln -sfn ../gpt2/1 model_repository/gpt2_static/1   # gpt2_static serves the same weights

demo: export
	$(PY) scripts/demo.py

serve: export
	$(PY) scripts/serve.py

test: export
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: export
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

bench: export
	$(PY) scripts/bench_dynamic_batching.py
	$(PY) scripts/bench_dense_layers.py
	$(PY) scripts/bench_decoding.py
	$(PY) scripts/bench_response_path.py
	$(PY) scripts/bench_batch_job.py
	$(PY) scripts/bench_priority.py --repeats 3
	$(PY) scripts/bench_loadgen.py

clean:
	rm -rf $(VENV) bench_results .pytest_cache
	rm -f $(ONNX) model_repository/minilm/1/tokenizer.json model_repository/gpt2_static/1
	rm -rf $(DECODER)
