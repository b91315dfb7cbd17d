# The two commands: `make demo` and `make test`.  Both run the idempotent
# setup first (Debian packages, .venv, C build).
.PHONY: all setup build test test-slow faults faults-slow demo fuzz lint docs package clean

all: build

setup:
	scripts/setup.sh

build: setup

test: setup
	scripts/test.sh

test-slow: setup
	CUTPOINT_SLOW=1 scripts/test.sh

drills: setup
	.venv/bin/python -m pytest -p no:cacheprovider --durations=5 -m slow -s dr-tests/tests/test_postgres_drill.py dr-tests/tests/test_cassandra_drill.py

# The fault matrix of docs/reliability.md: one injected fault per test
# (marker `fault`; the other suites leave these out).  `make faults`: the
# cells on the shared lab, then the Ceph cells on a lab whose guests write;
# `make faults-slow` (marker `slow` too): the cells that each replicate a
# recovery point and boot it at DR (a failover leaves the primary VMs
# stopped, so the test after it brings up a fresh lab).
FAULTS = api/tests/test_faults_lab.py api/tests/test_faults_plane_lab.py \
	api/tests/test_faults_retention_lab.py api/tests/test_redelivery_lab.py \
	api/tests/test_faults_ceph_lab.py
FAULTS_SLOW = api/tests/test_faults_plane_lab.py api/tests/test_faults_dr_lab.py \
	api/tests/test_faults_kill_dr_lab.py
faults: setup
	.venv/bin/python -m pytest -p no:cacheprovider --durations=0 -m 'fault and not slow' -s $(FAULTS)

faults-slow: setup
	.venv/bin/python -m pytest -p no:cacheprovider --durations=0 -m 'fault and slow' -s $(FAULTS_SLOW)

test-ansible: setup ; .venv/bin/pytest -m slow -s -v dr-tests/tests/test_ansible_vms.py

demo: setup
	scripts/demo.sh

fuzz: setup
	scripts/fuzz.sh $${FUZZ_SECONDS:-60}

# docs/cli.md from the commands' --help, and docs/api.md's route table from
# the OpenAPI document (api/tests/test_cli_docs.py and test_api_docs.py check them).
docs: setup
	scripts/cli-docs.sh
	.venv/bin/python scripts/api-docs.py

# The control plane's wheel and the host agent's .deb, in out/packages/.
package: setup
	scripts/package.sh

# ruff, then the package floors (import-linter contracts in setup.cfg).
lint: setup
	.venv/bin/ruff check api coordinator agent/client dr-tests
	.venv/bin/lint-imports

clean:
	-.venv/bin/cutpoint-lab down
	rm -rf build build-asan build-fuzz
