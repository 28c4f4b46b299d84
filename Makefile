# gpu-serving: everything runs from ./venv, which these targets create from the pinned requirements.
SHELL := /bin/bash
PYTHON ?= python3
VENV := venv
PY := $(VENV)/bin/python
STACK ?= prod
STAMP := $(VENV)/.installed

.PHONY: help venv render test checkers test-vm lint policy-check diff checkov lab-vm lab-vm-stop bench bench-vm bench-engine engine e2e cluster cluster-stop clean

help:
	@echo "make render [STACK=prod]   render the stack offline into rendered/<stack>/ (DEPLOYED=outputs.json: against a deployed stack)"
	@echo "make test                  run the test suite (creates ./venv on first use)"
	@echo "make test-vm               run the node scripts on a throwaway qemu VM (slow)"
	@echo "make lint                  ruff, shellcheck, yamllint"
	@echo "make policy-check FILES=…  check plain Kubernetes YAML with the policy pack"
	@echo "make diff BASE=<ref>       what the working tree changes in the rendered stack"
	@echo "make lab-vm / lab-vm-stop  the lab stack's node: a throwaway VM on 127.0.0.1:2222"
	@echo "make bench                 benchmarks into docs/BENCHMARKS.md"
	@echo "make bench-vm              node-step benchmark on a throwaway VM (slow; make bench includes it)"
	@echo "make engine                build the real Pulumi CLI and plugins from pinned Go modules (cached)"
	@echo "make e2e                   preview, up, grow, destroy under the real engine, lab VM as the node"
	@echo "make cluster [STACK=prod]  loopback Kubernetes control plane, one simulated GPU node per node of STACK"
	@echo "make cluster-stop          stop it, leaving nothing running"
	@echo "make bench-engine          real-engine benchmark: preview and no-op up against a bare program (make bench includes it)"

venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

render: $(STAMP)
	$(PY) -m tools.render $(STACK) $(if $(DEPLOYED),--deployed $(DEPLOYED))

test: $(STAMP) $(CHECKOV) checkers
	$(PY) -m pytest -q

# promtool and the CRD schemas the serving tests check against (tools/checkers, cached).
checkers:
	bash tools/checkers/build.sh >/dev/null

test-vm: $(STAMP)
	bash tests/vm/install-host-deps.sh
	GS_VM_TESTS=1 $(PY) -m pytest -q tests/vm

SHELL_SCRIPTS = $(wildcard components/node_scripts/*.sh tests/vm/*.sh tools/engine/*.sh tools/cluster/*.sh tools/checkers/*.sh .ci/run)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/shellcheck -x $(SHELL_SCRIPTS)
	$(VENV)/bin/yamllint -s Pulumi.yaml Pulumi.*.yaml

# checkov's dependencies conflict with pulumi's: it gets a venv of its own.
CHECKOV_VENV := .venv-checkov
CHECKOV := $(CHECKOV_VENV)/bin/checkov

$(CHECKOV):
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet --disable-pip-version-check checkov==3.3.30

checkov: $(CHECKOV) render
	BC_SKIP_MAPPING=TRUE $(CHECKOV) --config-file .checkov.yaml -d rendered/$(STACK)

policy-check: $(STAMP)
	@test -n "$(FILES)" || { echo 'usage: make policy-check FILES="a.yaml b.yaml"' >&2; exit 2; }
	$(PY) -m policy.check_yaml $(FILES)

diff: $(STAMP)
	@test -n "$(BASE)" || { echo 'usage: make diff BASE=<git ref> [STACK=prod]' >&2; exit 2; }
	$(PY) -m tools.diff $(BASE) $(STACK)

lab-vm: $(STAMP)
	bash tests/vm/install-host-deps.sh
	$(PY) -m tools.lab_vm start

lab-vm-stop: $(STAMP)
	$(PY) -m tools.lab_vm stop

bench: $(STAMP)
	$(PY) -m tools.bench $(BENCH_ARGS)

bench-vm: $(STAMP)
	bash tests/vm/install-host-deps.sh
	$(PY) -m tools.bench_node

# The real engine: built once per set of pinned versions into ~/.cache/gpu-serving/engine/,
# installed into ./.pulumi-home. A warm cache makes this a few seconds.
engine:
	bash tools/engine/build.sh

e2e: $(STAMP) engine
	bash tools/cluster/build.sh
	bash tests/vm/install-host-deps.sh
	$(PY) -m tools.e2e

# The loopback cluster's binaries are built once into ~/.cache/gpu-serving/cluster/ (tools/cluster).
cluster: $(STAMP)
	bash tools/cluster/build.sh
	bash tools/cluster/cluster.sh start $$($(PY) -m tools.cluster.nodes $(STACK))

cluster-stop:
	bash tools/cluster/cluster.sh stop

bench-engine: $(STAMP) engine
	bash tests/vm/install-host-deps.sh
	$(PY) -m tools.bench_engine

clean:
	rm -rf rendered .pytest_cache
