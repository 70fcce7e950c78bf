"""The documents hold together: docs/SPEC.md is the workspace's SPEC, every "SPEC §" reference
lands on a section or item of it, README.md stays a front door (short, no commit hashes, no
issue numbers), code comments carry no dates or commit hashes (those live in benchmarks/runs/
and the commit log), and every relative link in README.md and docs/*.md points at a file.

CPU only, a second or two; git is needed to list the repository's files."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "docs" / "SPEC.md"
README_MAX_LINES = 250

SPEC_REF = re.compile(r"SPEC §(\d+)(?:\.(\d+))?")
SPEC_SIGN = re.compile(r"SPEC §")
SECTION = re.compile(r"^## (\d+)\. \S")
LIST_ITEM = re.compile(r"^(\d+)\. \S")
# A commit hash: 7 to 40 hex digits, with at least one digit and one letter (so that words such
# as "facade" and plain numbers are not taken for one).
HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
LINK_DEF = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
HTML_LINK = re.compile(r"\b(?:href|src)=\"([^\"]+)\"")
REF_SUFFIXES = (".py", ".h", ".cuh", ".cu", ".cpp", ".md")
CODE_DIRS = ("te_fast", "te_ref", "csrc", "suites")
C_SUFFIXES = (".h", ".cuh", ".cu", ".cpp", ".c", ".cc")


def repo_files() -> list[Path]:
    """The repository's files: tracked ones and new ones git does not ignore."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot list the repository's files with git: {e}")
    paths = (ROOT / p for p in sorted(set(out.split("\0"))) if p)
    return [p for p in paths if p.is_file()]


# ----------------------------------------------------------------------------- SPEC


def spec_anchors(text: str) -> set[str]:
    """The anchors of SPEC.md: "N" for every section "## N. Title", and "N.M" for item M of
    section N's numbered list (items are lines "M. ..." at the left margin inside the section)."""
    anchors: set[str] = set()
    section = None
    for line in text.splitlines():
        if m := SECTION.match(line):
            section = m.group(1)
            anchors.add(section)
        elif line.startswith("#"):
            section = None
        elif section is not None and (m := LIST_ITEM.match(line)):
            anchors.add(f"{section}.{m.group(1)}")
    return anchors


def spec_references(text: str) -> tuple[list[str], int]:
    """The "N" / "N.M" of each "SPEC §" reference, and how many "SPEC §" signs have no number."""
    refs = [m.group(1) + (f".{m.group(2)}" if m.group(2) else "") for m in SPEC_REF.finditer(text)]
    return refs, len(SPEC_SIGN.findall(text)) - len(refs)


def test_spec_anchors_are_read_honestly():
    text = "# T\n\n## 1. A\n\n1. one\n2. two\n   3. not an item (indented)\n## 2. B\n- x\n"
    assert spec_anchors(text) == {"1", "1.1", "1.2", "2"}
    assert spec_references("SPEC §1, SPEC §2.3. SPEC § 4") == (["1", "2.3"], 1)
    anchors = spec_anchors(SPEC.read_text())
    assert {str(n) for n in range(1, 8)} <= anchors, f"SPEC sections 1-7 expected: {anchors}"
    assert "2.3" in anchors and "2.7" in anchors and "2.8" not in anchors


def test_every_spec_reference_resolves():
    anchors = spec_anchors(SPEC.read_text())
    bad = []
    for path in repo_files():
        if path.suffix not in REF_SUFFIXES or path == Path(__file__).resolve():
            continue  # (this file's own examples are not references)
        refs, bare = spec_references(path.read_text(errors="replace"))
        rel = path.relative_to(ROOT)
        bad += [f"{rel}: SPEC §{r}" for r in refs if r not in anchors]
        if bare:
            bad.append(f"{rel}: {bare} 'SPEC §' without a section number")
    assert not bad, (
        "references that docs/SPEC.md has no section (## N.) or numbered item (N.M) for:\n"
        + "\n".join(bad)
    )


# ----------------------------------------------------------------------------- README


def readme_problems(text: str) -> list[str]:
    problems = []
    lines = text.splitlines()
    if len(lines) > README_MAX_LINES:
        problems.append(f"{len(lines)} lines, more than {README_MAX_LINES}")
    for n, line in enumerate(lines, 1):
        problems += [f"line {n}: commit hash {m.group()!r}" for m in HASH.finditer(line)]
        problems += [f"line {n}: {m.group()!r}" for m in ISSUE.finditer(line)]
    return problems


def test_readme_is_a_front_door():
    assert readme_problems("a\n" * 3 + "ok since `0d56d66`, see issue 14\n") == [
        "line 4: commit hash '0d56d66'",
        "line 4: 'issue 14'",
    ]
    assert readme_problems("x\n" * (README_MAX_LINES + 1))
    problems = readme_problems((ROOT / "README.md").read_text())
    assert not problems, "README.md: " + "; ".join(problems) + " (history goes to docs/, runs/)"


# ----------------------------------------------------------------------------- code comments


def python_comments(source: str) -> list[tuple[int, str]]:
    """(line, text) of every `#` comment and every docstring."""
    found = []
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    found += [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    found.append((body[0].lineno, body[0].value.value))
    return found


def c_comments(source: str) -> list[tuple[int, str]]:
    """(line, text) of every `//` and `/* */` comment; string and char literals skipped."""
    found, i, n = [], 0, len(source)
    while i < n:
        c = source[i]
        if c in "\"'":
            j = i + 1
            while j < n and source[j] != c and source[j] != "\n":
                j += 2 if source[j] == "\\" else 1
            i = j + 1
        elif source.startswith("//", i):
            j = source.find("\n", i)
            j = n if j < 0 else j
            found.append((source.count("\n", 0, i) + 1, source[i:j]))
            i = j
        elif source.startswith("/*", i):
            j = source.find("*/", i + 2)
            j = n if j < 0 else j + 2
            found.append((source.count("\n", 0, i) + 1, source[i:j]))
            i = j
        else:
            i += 1
    return found


def comment_problems(path: Path, source: str) -> list[str]:
    if path.suffix == ".py":
        comments = python_comments(source)
    elif path.suffix in C_SUFFIXES:
        comments = c_comments(source)
    else:
        return []
    problems = []
    for line, text in comments:
        for what, pattern in (("date", DATE), ("commit hash", HASH)):
            for m in pattern.finditer(text):
                at = line + text.count("\n", 0, m.start())
                problems.append(f"{path}:{at}: {what} {m.group()!r} in a comment")
    return problems


def test_comment_scanner_finds_what_it_should():
    py = '"""Since 2026-12-04."""\nSEED = 20261202  # fixed in 15be9e5\nMASK = 0xdeadbeef1\n'
    assert comment_problems(Path("x.py"), py) == [
        "x.py:2: commit hash '15be9e5' in a comment",
        "x.py:1: date '2026-12-04' in a comment",
    ]
    cu = (
        'const char* s = "2026-12-05 // 4c77968";\nint m = 0x7fffffffa; // ok\n'
        "/* measured\n   2026-12-05 on 8dd06b2 */\n"
    )
    assert comment_problems(Path("k.cu"), cu) == [
        "k.cu:4: date '2026-12-05' in a comment",
        "k.cu:4: commit hash '8dd06b2' in a comment",
    ]


def test_code_comments_carry_no_dates_or_hashes():
    problems = []
    for path in repo_files():
        rel = path.relative_to(ROOT)
        if rel.parts[0] in CODE_DIRS:
            problems += comment_problems(rel, path.read_text(errors="replace"))
    assert not problems, (
        "dated results and commit hashes belong in benchmarks/runs/, docs/performance.md and the "
        "commit log, not in code comments:\n" + "\n".join(problems)
    )


# ----------------------------------------------------------------------------- links


def link_targets(text: str) -> list[str]:
    """Relative link targets of a Markdown text: inline links and images, reference
    definitions, and HTML href/src attributes."""
    targets = [m.group(1) for m in LINK.finditer(text)] + LINK_DEF.findall(text)
    targets += HTML_LINK.findall(text)
    relative = []
    for t in targets:
        t = t.strip("<>").split("#", 1)[0]
        if t and not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE):
            relative.append(t)
    return relative


def test_relative_links_point_at_files():
    text = '[a](docs/x.md#s) ![p](p.png) [w](https://x.org) [s](#top) <img src="i.png">'
    assert link_targets(text) == ["docs/x.md", "p.png", "i.png"]
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for doc in documents:
        for target in link_targets(doc.read_text()):
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, "relative links to missing files:\n" + "\n".join(broken)
