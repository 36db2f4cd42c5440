"""The docs tests' readers of the README and docs/: the repository root, a README section, the
fenced blocks of a document, and the list of documents.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["DOCS", "ROOT", "blocks", "blocks_text"]


ROOT = Path(__file__).resolve().parent.parent


def blocks(doc: str, lang: str) -> list[str]:
    """The fenced code blocks of `doc` (a path under the repository) in language `lang`."""
    return [str(b) for b in re.findall(rf"```{lang}\n(.*?)```", (ROOT / doc).read_text(), re.S)]


def blocks_text(name: str) -> str:
    return (ROOT / "docs" / f"{name}.md").read_text()


DOCS = ["README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md")))]
