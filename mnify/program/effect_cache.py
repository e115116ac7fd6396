"""Summaries of installed packages' modules, kept between conversions (docs/design.md §1
"Effects").

A module of an installed package is read, parsed and summarised the first time a conversion's
calls reach it; the summary (plain JSON, ``effect_summary``) is stored under the user's cache
directory (``$XDG_CACHE_HOME/mnify`` or ``~/.cache/mnify``), keyed by the file's path, size and
modification time and by the fixed effect table it was made with. A cached summary is exactly
what a fresh one would be, so a conversion's output is the same with a cold, warm or unwritable
cache; any error reading or writing the cache only costs the time of summarising again.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import tempfile
from pathlib import Path

from mnify import vocabulary as vocab
from mnify.program.effect_summary import Summary, summarise

# bump when a summary's shape or meaning changes
_VERSION = "3"


def _table_digest() -> str:
    parts = [
        _VERSION,
        repr(sorted(vocab.EFFECT_TABLE_ROOTS)),
        repr(sorted(vocab.EFFECT_FILE_WRITERS)),
        repr(sorted(vocab.EFFECT_WRITER_METHODS)),
        repr(sorted(vocab.EFFECT_WRITING_EXTENSIONS)),
        repr(sorted(vocab.EFFECT_IMPORT_CHANGERS)),
        repr(sorted(vocab.SUBPROCESS_CALLS)),
        repr(sorted(vocab.COLLECTIVE_METHODS)),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def default_directory() -> Path:
    """``$XDG_CACHE_HOME/mnify/effects`` (``~/.cache/mnify/effects`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mnify" / "effects"


class SummaryCache:
    """Summaries of files on disk by path, size and mtime; ``directory=None``: no cache."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._digest = _table_digest()
        self.hits = 0
        self.misses = 0

    def summary(self, path: str, module: str, is_package: bool) -> Summary | None:
        """The summary of the module ``module`` in the file ``path``; None when the file cannot
        be read or parsed."""
        try:
            stat = os.stat(path)
        except OSError:
            return None
        key = hashlib.sha256(
            "\0".join(
                [self._digest, os.path.abspath(path), module, str(is_package)]
                + [str(stat.st_size), str(stat.st_mtime_ns)]
            ).encode()
        ).hexdigest()
        cached = self._read(key)
        if cached is not None:
            self.hits += 1
            return cached
        self.misses += 1
        try:
            with open(path, "rb") as handle:
                tree = ast.parse(handle.read(), filename=path)
        except (OSError, SyntaxError, ValueError):
            return None
        made = summarise(tree, module, is_package)
        # through JSON, so a fresh summary is exactly what a cached one reads back as
        text = json.dumps(made, sort_keys=True, separators=(",", ":"))
        self._write(key, text)
        loaded: Summary = json.loads(text)
        return loaded

    def _read(self, key: str) -> Summary | None:
        if self.directory is None:
            return None
        try:
            with open(self.directory / f"{key}.json", encoding="utf-8") as handle:
                loaded = json.load(handle)
        except (OSError, ValueError):
            return None
        return loaded if isinstance(loaded, dict) else None

    def _write(self, key: str, text: str) -> None:
        if self.directory is None:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, self.directory / f"{key}.json")
        except OSError:
            return
