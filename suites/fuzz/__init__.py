"""Hypothesis fuzzing: strategies that draw cases, checks that judge them."""

# Why a fuzz test file skips where hypothesis is missing (pytest.importorskip's reason).
HYPOTHESIS_MISSING = (
    "hypothesis is not installed (pip install -e '.[test]'; on a machine without a registry carry "
    "its wheels for that machine's Python, e.g. python -m pip download hypothesis "
    "sortedcontainers --no-deps --only-binary=:all: --python-version 3.12 --platform "
    "manylinux2014_x86_64 -d .whl, which tools/gpu_run.sh installs)"
)
