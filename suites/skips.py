"""A skip is recorded with its kind and reasons (the report's ``skip``), never told by its text.

Kinds: "declined" (the adapter's support declaration turns the case away: the implementation
does not take it), "environment" (this machine lacks what the case needs: a CUDA device, an
installed package, a build), "inexpressible" (the combination does not exist, whatever the
implementation: GQA on a qkv-packed buffer). The conformance matrix counts declined cases as
"not supported" and the others as "not run"; each reason names the feature it concerns
(suites/features.py), so that a matrix cell shows the reason about its own row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

import pytest

from te_conformance.reports import record

KINDS = ("declined", "environment", "inexpressible")


@dataclass(frozen=True)
class Reason:
    """One reason a case cannot run: ``text`` (what the skip says) and the ``feature`` it
    concerns (a suites/features.py key, or None)."""

    text: str
    feature: str | None = None

    def __str__(self) -> str:
        return self.text


def skip(kind: str, reasons) -> NoReturn:
    """Skip the running test with ``reasons`` (Reason or str), recorded as ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"unknown skip kind {kind!r}; expected one of {KINDS}")
    found = [r if isinstance(r, Reason) else Reason(str(r)) for r in reasons if r]
    record.skip(kind, [{"text": r.text, "feature": r.feature} for r in found])
    text = "; ".join(r.text for r in found) or kind
    try:  # pytest's -rs line names the test, not this helper (as a skipif mark's does)
        error = pytest.skip.Exception(text, _use_item_location=True)
    except TypeError:  # a pytest without the keyword (it is private): this helper's line
        error = pytest.skip.Exception(text)
    raise error


def unless(kind: str, reasons) -> None:
    """``skip(kind, reasons)`` where there is any reason; nothing otherwise."""
    found = [r for r in reasons if r]
    if found:
        skip(kind, found)
