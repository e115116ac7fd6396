"""One vocabulary: no second list of Chainer names in lint or the rewrites, and lint pulls in
none of the heavy libraries it reasons about."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from mnify import vocabulary as vocab

ROOT = Path(__file__).resolve().parents[1]
QUALIFIED = re.compile(r"^(chainer|chainermn|mnify\.runtime)(\.\w+)+$")


def _qualified_strings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and QUALIFIED.match(node.value)
    ]


def test_no_qualified_framework_name_outside_the_vocabulary() -> None:
    found = []
    for package in ("lint", "rewrites"):
        for path in sorted((ROOT / "mnify" / package).rglob("*.py")):
            found.extend(_qualified_strings(path))
    assert found == []
    assert _qualified_strings(ROOT / "mnify" / "vocabulary.py")  # ... and they do live here


def test_lint_imports_no_mpi_cupy_or_chainer(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import chainer\nimport chainermn\ncomm = chainermn.create_communicator()\n")
    code = (
        "import json, sys\n"
        "from mnify.lint import lint_source\n"
        "from mnify.cli import lint as cli_lint\n"
        "lint_source(open(sys.argv[1]).read(), sys.argv[1])\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('mpi4py', 'cupy', 'chainer', 'chainermn'))))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(script)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert json.loads(run.stdout) == []


def test_vocabulary_predicates_agree_on_spellings() -> None:
    assert vocab.is_optimizer("chainer.optimizers.Adam")
    assert vocab.is_optimizer("chainer.optimizers.adam.Adam")
    assert not vocab.is_optimizer("chainer.optimizers.adam.AdamRule")
    assert not vocab.is_optimizer("chainer.optimizers.Optimizer")
    assert vocab.is_iterator("chainer.iterators.DaliIterator")
    assert vocab.is_iterator("chainer.iterators.serial_iterator.SerialIterator")
    assert "chainer.backends.cuda.cupy.cuda.Device" in vocab.DEVICE_GETTERS
    assert vocab.is_scatter("mnify.runtime.scatter_dataset")
    assert vocab.is_scatter("chainermn.datasets.scatter_dataset")
    assert not vocab.is_scatter("mylib.scatter_dataset")
    for hazard in ("os.posix_spawn", "subprocess.run"):
        assert hazard in vocab.SUBPROCESS_CALLS
    assert "pty.fork" in vocab.FORK_CALLS
    assert "concurrent.futures.ProcessPoolExecutor" in vocab.PROCESS_FACTORIES
