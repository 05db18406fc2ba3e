"""The fenced blocks of README.md and docs/*.md, as tests/test_readme.py and
tests/test_torch_readme.py run them (the rules are in docs/development.md, "Snippets in the
documentation"):

- ``python``: run, a page's blocks in order sharing one namespace; those that use torch apart;
- ``sh``: run with bash from a temporary directory, exit status 0 unless ``<!-- exits: N -->``;
- ``text``: output; anything else is not a snippet;
- ``<!-- not run: why -->`` or ``<!-- run by: tests/<file>.py -->`` on the line above a python or
  sh block says why this is not where it runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
RUNNABLE = ("python", "sh")
MARKERS = ("not run", "run by", "exits", "output of")
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
_MARKER = re.compile(r"^<!--\s*(" + "|".join(MARKERS) + r"):\s*(.*?)\s*-->$")
# The first word of a line that is a command, in a block that names no language.
_COMMAND_WORDS = ("python", "python3", "pip", "pytest", "cmake", "ctest", "source", "torchrun", "acl-swiglu-sample",
                  "git", "cd", "export", "tools/", "benchmarks/", "./", "$ ")
_TORCH = re.compile(r"\btorch\b")


@dataclass(frozen=True)
class Snippet:
    page: Path
    line: int                       # the line of the opening fence, from 1
    language: str
    code: str
    marker: Optional[Tuple[str, str]]   # (kind, text) of the marker line right above, if any

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def uses_torch(self) -> bool:
        return self.language == "python" and bool(_TORCH.search(self.code))

    @property
    def runs_here(self) -> bool:
        """A python or sh block that the snippet tests run themselves."""
        return self.language in RUNNABLE and (self.marker is None or self.marker[0] == "exits")

    @property
    def expected_status(self) -> int:
        return int(self.marker[1]) if self.marker and self.marker[0] == "exits" else 0

    def looks_like_a_command(self) -> bool:
        first = next((line.strip() for line in self.code.splitlines() if line.strip()), "")
        return first.startswith(_COMMAND_WORDS) or bool(re.match(r"^[A-Z_][A-Z0-9_]*=\S* ", first))


def snippets(page: Path) -> List[Snippet]:
    text = page.read_text()
    found = []
    for match in _FENCE.finditer(text):
        start = match.start()
        before = text[:start].rstrip("\n").rsplit("\n", 1)[-1].strip()
        marker = _MARKER.match(before)
        found.append(Snippet(page, text.count("\n", 0, start) + 1, match.group(1).strip(), match.group(2),
                             (marker.group(1), marker.group(2)) if marker else None))
    return found


def all_snippets() -> List[Snippet]:
    return [snippet for page in PAGES for snippet in snippets(page)]


def python_chains(torch: bool) -> List[Tuple[Path, List[Snippet]]]:
    """Per page, its python blocks that run here and do (torch=True) or do not use torch, in order."""
    chains = []
    for page in PAGES:
        blocks = [s for s in snippets(page) if s.language == "python" and s.runs_here and s.uses_torch == torch]
        if blocks:
            chains.append((page, blocks))
    return chains


def run_chain(blocks: List[Snippet]) -> dict:
    """Runs a page's blocks in order in one namespace, as a reader pasting them would."""
    namespace: dict = {"__name__": "__snippet__"}
    for block in blocks:
        exec(compile(block.code, block.where, "exec"), namespace)
    return namespace


def section(page: Path, title: str) -> str:
    """The text of the `## title` section of a page, up to the next section of that level or higher."""
    text = page.read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"{page.name} has no '## {title}' section"
    return match.group(1)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set:
    text = _FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}
