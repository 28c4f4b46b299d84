# gpu-serving: everything runs from ./venv, which these targets create from the pinned requirements.
SHELL := /bin/bash
PYTHON ?= python3
VENV := venv
PY := $(VENV)/bin/python
STACK ?= prod
# One venv, two stamps: rendering needs only the program's runtime (requirements.txt); tests,
# linters, benchmarks and the policy pack's SDK add requirements-dev.txt on top.
RUNTIME_STAMP := $(VENV)/.installed-runtime
STAMP := $(VENV)/.installed
# A venv that already has the dev tools has the runtime too: render uses it as it is.
RENDER_STAMP = $(if $(wildcard $(STAMP)),$(STAMP),$(RUNTIME_STAMP))
PYTHON_MIN := 3.11

# checkov's dependencies conflict with pulumi's: it gets a venv of its own.
CHECKOV_VENV := .venv-checkov
CHECKOV := $(CHECKOV_VENV)/bin/checkov

.PHONY: help venv python-version render test docs node-scripts package-args docs-site checkers test-vm lint policy-check diff checkov lab-vm lab-vm-stop bench bench-vm bench-engine engine e2e cluster cluster-stop clean

help:
	@echo "make render [STACK=prod]   render the stack offline into rendered/<stack>/ and print its plan (DEPLOYED=outputs.json: against a deployed stack)"
	@echo "make test                  run the test suite, checkov included (creates ./venv and .venv-checkov on first use)"
	@echo "make docs                  regenerate the generated pages: docs/configuration.md, the rules of docs/policy.md"
	@echo "make node-scripts          write components/node/linked/ (the node steps as each node receives them) after a script change"
	@echo "make package-args          write package/args.py (the component package's argument types) after a change of the config models"
	@echo "make docs-site             build the documentation site into site/ (mkdocs, strict: a broken link fails)"
	@echo "make test-vm               run the node scripts on a throwaway qemu VM (slow)"
	@echo "make checkers              build promtool and fetch the CRD schemas the tests check against (cached; make test runs it)"
	@echo "make lint                  ruff, shellcheck, yamllint"
	@echo "make checkov [STACK=prod]  render, then checkov on rendered/<stack>/ (its own venv, .venv-checkov)"
	@echo "make policy-check FILES=…  check plain Kubernetes YAML with the policy pack"
	@echo "make diff BASE=<ref>       what the working tree changes in the rendered stack (summary, then diffs)"
	@echo "make lab-vm / lab-vm-stop  the lab stack's node: a throwaway VM on 127.0.0.1:2222"
	@echo "make bench                 benchmarks into bench-out/ (BENCH_ARGS=--update-docs: into docs/; --quick: a fast check)"
	@echo "make bench-vm              node-step benchmark on a throwaway VM into bench-out/ (slow; make bench includes it)"
	@echo "make engine                build the real Pulumi CLI and plugins from pinned Go modules (cached)"
	@echo "make e2e [E2E_ARGS=…]      preview, up, grow, destroy under the real engine, lab VM as the node (E2E_ARGS=--skip a,b)"
	@echo "make cluster [STACK=prod]  loopback Kubernetes control plane, one simulated GPU node per node of STACK"
	@echo "make cluster-stop          stop it, leaving nothing running"
	@echo "make bench-engine          real-engine benchmark against a bare program: prod, and fleets up to 32 nodes x 100 models (make bench includes it; BENCH_ARGS=--quick: a fast check)"
	@echo "make venv                  create ./venv with everything (make render alone installs only the runtime)"
	@echo "make python-version        check that PYTHON (python3) is new enough"
	@echo "make clean                 remove rendered/, bench-out/, site/ and test caches"

venv: $(STAMP)

# Checked before pip: an old interpreter otherwise ends in pages of resolver output.
CHECK_PYTHON = v=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
	|| { echo "gpu-serving needs Python $(PYTHON_MIN) or newer; '$(PYTHON)' does not run (set PYTHON=/path/to/python$(PYTHON_MIN))" >&2; exit 1; }; \
	[ "$$(printf '%s\n' "$(PYTHON_MIN)" "$$v" | sort -V | head -n1)" = "$(PYTHON_MIN)" ] \
	|| { echo "gpu-serving needs Python $(PYTHON_MIN) or newer; $(PYTHON) is $$v (set PYTHON=/path/to/python$(PYTHON_MIN))" >&2; exit 1; }

python-version:
	@$(CHECK_PYTHON); echo "$(PYTHON) is Python $$v: fine"

# uv installs the pinned requirements into the venv: the same packages as pip, about 8x faster on a
# machine with no download cache (44 s against 356 s for requirements-dev.txt, measured in one run).
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv
$(UV):
	@test -x $(PY) || { $(CHECK_PYTHON); }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

$(RUNTIME_STAMP): requirements.txt | $(UV)
	$(UV) pip install --quiet --python $(PY) -r requirements.txt
	touch $@

# requirements-dev.txt includes requirements.txt: this stamp stands for both.
$(STAMP): requirements.txt requirements-dev.txt | $(UV)
	$(UV) pip install --quiet --python $(PY) -r requirements-dev.txt
	touch $(RUNTIME_STAMP) $@

# Not echoed: a config error is then the render's one line, followed only by make's own
# "make: *** [...render] Error 1" (make exits 2); docs/rendering.md says so.
render: $(RENDER_STAMP)
	@$(PY) -m tools.render $(STACK) $(if $(DEPLOYED),--deployed $(DEPLOYED))

# One pytest worker per core (pytest-xdist): the suite is CPU-bound renders under the mock engine.
test: $(STAMP) $(CHECKOV) checkers
	$(PY) -m pytest -q -n auto

# The generated pages (tools/docs.py lists them); tests/test_docs.py fails when one is stale.
docs: $(STAMP)
	$(PY) -m tools.docs

# The node steps' linked scripts, as each node's copy step delivers them (tests/test_node.py fails when stale).
node-scripts: $(STAMP)
	$(PY) -m tools.node_scripts

# The component package's argument types, from the config models (tests/test_package.py fails when stale).
package-args: $(STAMP)
	$(PY) -m tools.package_args

docs-site: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# promtool and the CRD schemas the serving tests check against (testbed/checkers, cached): promtool
# from Debian's package (PROMTOOL=module: built from the pinned Prometheus 3 module), the CRDs from
# their Go modules (without Go, the tests that need them skip and say so).
checkers:
	@bash testbed/checkers/build.sh >/dev/null

test-vm: $(STAMP)
	bash testbed/vm/install-host-deps.sh
	GS_VM_TESTS=1 $(PY) -m pytest -q -n auto --dist loadfile --durations=20 tests/vm $(VM_ARGS)

SHELL_SCRIPTS = $(wildcard components/node/scripts/*.sh components/serving/programs/*.sh testbed/vm/*.sh testbed/vm/fakes/*.sh testbed/engine/*.sh testbed/cluster/*.sh testbed/checkers/*.sh testbed/endpoint/*.sh .ci/run)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/shellcheck -x $(SHELL_SCRIPTS)
	$(VENV)/bin/yamllint -s Pulumi.yaml Pulumi.*.yaml

$(CHECKOV): | $(UV)
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(UV) pip install --quiet --python $(CHECKOV_VENV)/bin/python checkov==3.3.30

checkov: $(CHECKOV) render
	BC_SKIP_MAPPING=TRUE $(CHECKOV) --config-file .checkov.yaml -d rendered/$(STACK)

policy-check: $(STAMP)
	@test -n "$(FILES)" || { echo 'usage: make policy-check FILES="a.yaml b.yaml"' >&2; exit 2; }
	$(PY) -m policy.check_yaml $(FILES)

# A difference is the answer, not a failure: make exits 0 (and prints no "*** Error") when the
# renders could be compared; `python -m tools.diff` itself exits 1 on a difference for scripts.
diff: $(RENDER_STAMP)
	@test -n "$(BASE)" || { echo 'usage: make diff BASE=<git ref> [STACK=prod]' >&2; exit 2; }
	@status=0; $(PY) -m tools.diff $(BASE) $(STACK) || status=$$?; [ "$$status" -le 1 ] || exit "$$status"

lab-vm: $(STAMP)
	bash testbed/vm/install-host-deps.sh
	$(PY) -m testbed.lab_vm start

lab-vm-stop: $(STAMP)
	$(PY) -m testbed.lab_vm stop

bench: $(STAMP)
	$(PY) -m testbed.bench $(BENCH_ARGS)

bench-vm: $(STAMP)
	bash testbed/vm/install-host-deps.sh
	$(PY) -m testbed.bench_node $(BENCH_ARGS)

# The real engine: built once per set of pinned versions into ~/.cache/gpu-serving/engine/,
# installed into ./.pulumi-home. A warm cache makes this a few seconds.
engine:
	bash testbed/engine/build.sh

e2e: $(STAMP) engine
	bash testbed/cluster/build.sh
	bash testbed/endpoint/build.sh >/dev/null
	bash testbed/vm/install-host-deps.sh
	$(PY) -m testbed.e2e $(E2E_ARGS)

# The loopback cluster's binaries are built once into ~/.cache/gpu-serving/cluster/ (testbed/cluster).
cluster: $(STAMP)
	bash testbed/cluster/build.sh
	bash testbed/cluster/cluster.sh start $$($(PY) -m testbed.cluster.nodes $(STACK))

cluster-stop:
	bash testbed/cluster/cluster.sh stop

bench-engine: $(STAMP) engine
	bash testbed/vm/install-host-deps.sh
	$(PY) -m testbed.bench_engine $(BENCH_ARGS)

clean:
	rm -rf rendered bench-out site .pytest_cache
