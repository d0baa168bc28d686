# The two commands of the README. Each installs what it needs on a fresh machine, then runs.
#   make quickstart   FedAvg on real Fashion-MNIST, 2 ranks under torchrun, prints the final accuracy
#   make test         the whole test suite (what CI runs, through .ci/run), with a one-node Slurm for
#                     tests/integration/test_slurm.py (installed here, started and stopped by the tests as root)
#   make test-unit    tests/unit alone (also test-methods, test-integration: one folder of the suite)
VENV ?= .venv
PYTHON = $(VENV)/bin/python
SUDO = $(shell [ "$$(id -u)" = 0 ] || echo sudo)
FMNIST = /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

.PHONY: quickstart test test-unit test-methods test-integration install data slurm

install: $(VENV)/.installed
$(VENV)/.installed: setup.py
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -e '.[test]'
	touch $@

# Real Fashion-MNIST from Debian (no download at run time); distfl finds it there by itself.
data:
	@[ -f $(FMNIST) ] || ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq dataset-fashion-mnist)

# Slurm and munge from Debian, for the Slurm tests (they start a one-node cluster with slurm/dev-cluster.sh).
slurm:
	@command -v slurmctld >/dev/null || [ -x /usr/sbin/slurmctld ] || ($(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge)

quickstart: install data
	$(VENV)/bin/torchrun --nproc_per_node=2 -m distfl train configs/quickstart.yaml --overwrite

test: install data slurm
	$(PYTHON) -m pytest -q

test-unit test-methods test-integration: install
	$(PYTHON) -m pytest -q tests/$(@:test-%=%)
