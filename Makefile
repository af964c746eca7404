# gpuheal: two commands on a fresh machine.
#   make demo   local control plane, 20 fake GPU nodes, a GPU Deployment, the GPU state
#   make test   lint, type check, every test tier (the multi-version one too)
# Both install what they need: a virtualenv (.venv) and the control-plane
# binaries built from the Go module proxy (.cache/testenv, rebuilt only when testenv/ changes;
# node-problem-detector beside them, rebuilt only when testenv/npd/ changes; the oldest
# supported and the newest stable Kubernetes for the multi-version tier in .cache/testenv-<minor>,
# each rebuilt only when its testenv/versions/<minor>/ changes),
# kured for the reboot test (.cache/kured, rebuilt only when testenv/kured/ changes),
# and the NVML stand-in the agent runs over (.cache/nvml, rebuilt only when testenv/nvml/ changes).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint unit integration e2e chaos soak versions node node-tier image testenv nvml monitoring browser awks venv clean bench lock

demo: $(STAMP) testenv nvml
	$(BIN)/gpuheal demo

test: lint testenv nvml node image monitoring browser awks
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

unit: $(STAMP) nvml awks
	$(BIN)/pytest -m unit

integration: $(STAMP) testenv nvml monitoring browser
	$(BIN)/pytest -m integration

e2e: $(STAMP) testenv nvml
	$(BIN)/pytest -m e2e

# Crashes, failovers and outages during fault storms (part of `make test` too).
# GPUHEAL_CHAOS_ROUNDS (5 here) / GPUHEAL_CHAOS_SEED steer the random-kill rounds.
chaos: $(STAMP) testenv nvml
	$(BIN)/pytest -m chaos

# The long soak of the random kills (not part of `make test`): 40 rounds of a
# 100-fault storm, one to three SIGKILLs each (about 12 minutes here).
soak: $(STAMP) testenv nvml
	GPUHEAL_CHAOS_ROUNDS=$${GPUHEAL_CHAOS_ROUNDS:-40} $(BIN)/pytest -m chaos \
	  tests/chaos/test_chaos.py::test_random_sigkills_during_storms_remediate_every_fault_exactly_once

# The core of the integration tier on the other Kubernetes versions (part of `make test`
# too): the oldest supported and the newest stable, one control plane each (tests/versions).
versions: $(STAMP) testenv nvml
	$(BIN)/pytest -m versions

# The node tier (part of `make test` too): a real kubelet over Debian's containerd, runc
# and CNI plugins, joined to the local control plane (gpuheal/sim/realnode.py).
node-tier: $(STAMP) testenv nvml node image
	$(BIN)/pytest -m node

# What a real node needs: Debian's container runtime, runc, CNI plugins, socat (the API
# server's relay into the node's network) and busybox-static (the test workload image),
# then the kubelet and the images (testenv/node/build.sh, its own stamp).
node:
	@command -v containerd >/dev/null && command -v runc >/dev/null && command -v socat >/dev/null \
	  && test -x /usr/lib/cni/bridge && dpkg -s busybox-static >/dev/null 2>&1 && command -v gcc >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends containerd runc containernetworking-plugins socat \
	    busybox-static iproute2 gcc libc6-dev >/dev/null; }
	testenv/node/build.sh
	testenv/deviceplugin/build.sh

# gpuheal's image without docker or a registry (deploy/docker/build.sh: Debian's python3
# by mmdebstrap, the locked wheels, gpuheal), as an OCI archive in .cache/image: the one
# the node tier runs the chart with; and NVIDIA's device plugin on its base
# (testenv/deviceplugin/image.sh) for the node tier's GPUs.
image: $(STAMP) node
	@command -v mmdebstrap >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends mmdebstrap >/dev/null; }
	PYTHON=$(BIN)/python deploy/docker/build.sh
	PYTHON=$(BIN)/python testenv/deviceplugin/image.sh

# The control plane, kwok and helm (testenv/build.sh), kured, the real reboot daemon
# tests/integration/test_kured.py runs (testenv/kured/build.sh), node-problem-detector,
# which tests/integration/test_npd.py runs (testenv/npd/build.sh), and the other Kubernetes
# versions tests/versions runs on (testenv/versions/build.sh: cold, each compiles Kubernetes
# again, niced; the Go build cache keeps it): each has its own stamp.
testenv:
	testenv/build.sh
	testenv/kured/build.sh
	testenv/npd/build.sh
	testenv/versions/build.sh

# The NVML stand-in every agent test runs over: libnvidia-ml.so.1 and nvidia-smi, built
# from testenv/nvml/ with the machine's gcc and Debian's libyaml-dev (installed when missing).
nvml:
	@command -v gcc >/dev/null && test -f /usr/include/yaml.h || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends gcc libc6-dev libyaml-dev >/dev/null; }
	testenv/nvml/build.sh

# Real Prometheus and Alertmanager for the alert-path tests: Debian's packages.
monitoring:
	@command -v prometheus >/dev/null && command -v prometheus-alertmanager >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends prometheus prometheus-alertmanager >/dev/null; }

# A real headless browser for the console's tests: Debian's chromium, driven by
# the playwright package (never `playwright install`: no browser download).
browser:
	@command -v chromium >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends chromium >/dev/null; }

# Every awk the validation Job's script may meet in a DCGM image (Ubuntu's mawk, UBI's
# gawk, busybox's, the one true awk): the unit tests run the script under each.
awks:
	@command -v mawk >/dev/null && command -v gawk >/dev/null && command -v busybox >/dev/null \
	  && command -v original-awk >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends mawk gawk busybox original-awk >/dev/null; }

venv: $(STAMP)

# The runtime dependencies at exactly the image's versions and hashes first
# (deploy/docker/requirements.lock), then gpuheal itself and the dev tools.
$(STAMP): pyproject.toml deploy/docker/requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --require-hashes -r deploy/docker/requirements.lock
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# Re-lock the runtime dependencies after a change to pyproject.toml's (uv, a dev tool).
lock: $(STAMP)
	UV=$(BIN)/uv tools/lock.sh

clean:
	rm -rf $(VENV) .cache .mypy_cache .pytest_cache .ruff_cache

BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $@

# Cluster-scale benchmarks; results in bench/results/, plots in docs/img/.
bench: $(BENCH_STAMP) testenv nvml monitoring
	$(BIN)/python bench/controlplane_start.py --runs 5
	$(BIN)/python bench/agent.py --seconds 20
	$(BIN)/python bench/alerts.py --posts 10000
	$(BIN)/python bench/quarantine.py --singles 200 --storms 50 200
	$(BIN)/python bench/scale.py --nodes 1000 2500 5000
	$(BIN)/python bench/dra.py --nodes 1000
	$(BIN)/python bench/lists.py --nodes 5000 --rounds 3
	$(BIN)/python bench/transport.py --nodes 1000 --rounds 3
	$(BIN)/python bench/profile_storm.py --nodes 200 --seconds 15
	$(BIN)/python bench/hygiene.py --nodes 1000 5000
	$(BIN)/python bench/cli.py --nodes 1000
	$(BIN)/python bench/retention.py --records 5000 --deletes-per-second 20 200
	$(BIN)/python bench/rollout.py --fleet 500 --pool 40 --batch 4 --idle 30
	$(BIN)/python bench/properties.py --seeds 1-1000 --examples 20000
