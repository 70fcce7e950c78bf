"""The conformance tool's installed names: ``te_conformance.suites`` (the checkout's ``suites/``:
the pytest suites, their adapters and checks) and ``te_conformance.reports`` (``reports/``: the
report plugin, the reports and the verdict). ``python -m te_conformance`` is the report tool's
command line (``run``, ``compare``, ``merge``, ``rename``, ``render``, ``screenshot``,
``matrix``).

pyproject.toml maps the two folders under this package. In a checkout that is not installed (a
GPU machine's working tree, the mutation harness's scratch copies), the checkout's root joins
this package's path, so that the same names resolve to the checkout's folders there too.
"""

from pathlib import Path

_checkout = Path(__file__).resolve().parent.parent
if all((_checkout / part / "plugin.py").is_file() for part in ("suites", "reports")):
    __path__.append(str(_checkout))  # noqa: F821  (a package's __path__)
