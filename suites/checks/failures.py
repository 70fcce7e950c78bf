"""What a failed check is: one judged property of one tensor (CheckError), or several at once
(JudgementError). The expected outcomes (suites/expected.py) explain failures by their kind and
tensor, never by their message. No torch here: the suites' plugin imports it at start."""

from __future__ import annotations

# The checks that compare a tensor's values with the reference (checks/attention.py judge()):
# SPEC §6's error ratio and the exact zeros of SPEC §2.4-2.5. What a known failure or an
# adapter's declared difference may fail by; dtype, shape, NaN and unjudgeable failures never.
VALUE_CHECKS = ("ratio", "zero_rows")


class CheckError(AssertionError):
    """A judged property of one tensor failed. ``tensor`` names it ("out", "dq", "y", ...);
    ``kind`` says which check: "ratio" (SPEC §6's error-ratio rule), "unjudgeable" (the rule's
    bound is infinite), "zero_rows" (exact zeros of SPEC §2.4-2.5), "nan", "dtype", "shape",
    "table" (the mask table's grids), "refusal" (a call the standard refuses returned)."""

    kind = ""

    def __init__(self, message: str = "", kind: str | None = None, tensor: str = "",
                 ratio: float | None = None):  # fmt: skip
        super().__init__(message)
        if kind is not None:
            self.kind = kind
        self.tensor = tensor
        self.ratio = ratio  # a ratio failure's error / bound (None: not a ratio, or not told)

    @classmethod
    def new(cls, kind: str, tensor: str, message: str, ratio: float | None = None) -> CheckError:
        """The failure of ``tensor``'s ``kind`` check (a RatioError for "ratio", with its
        ``ratio``)."""
        made = RatioError if kind == "ratio" else cls
        return made(message, kind, tensor, ratio)

    def __reduce__(self):  # pickles with its kind, tensor and ratio (xdist, multiprocessing)
        return (type(self), (str(self), self.kind, self.tensor, self.ratio))


class RatioError(CheckError):
    """A tensor failed SPEC §6's error-ratio rule."""

    kind = "ratio"


class JudgementError(AssertionError):
    """Several checks failed in one judgement: ``failures`` holds each (the message joins
    theirs). One failure alone is raised as itself (raise_failures)."""

    def __init__(self, failures: list[AssertionError]):
        super().__init__("\n".join(str(f) for f in failures))
        self.failures = list(failures)


def raise_failures(failures: list[AssertionError]) -> None:
    """Nothing for no failure; the failure itself for one; a JudgementError for several."""
    if len(failures) == 1:
        raise failures[0]
    if failures:
        raise JudgementError(failures)


def failures_of(error: BaseException) -> list[BaseException]:
    """The single failures an error stands for (a JudgementError's, else the error itself)."""
    return list(error.failures) if isinstance(error, JudgementError) else [error]
