"""The effect analysis (mnify/program/effects.py): what each function does, transitively, found
through each kind of shape real projects reach it by, with packages read from disk (never
imported) and cached without changing any answer."""

from __future__ import annotations

import ast
import os
import sys
import textwrap
from pathlib import Path

import pytest

from mnify.program.effect_cache import SummaryCache
from mnify.program.effects import ProjectEffects


def _project(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    made = {}
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        made[name] = path
    return made


def _effects(
    paths: dict[str, Path],
    converted: list[str],
    search: list[Path] = (),  # type: ignore[assignment]
    cache: SummaryCache | None = None,
) -> ProjectEffects:
    trees = {str(paths[n]): ast.parse(paths[n].read_text()) for n in converted}
    return ProjectEffects(
        trees, search_path=[str(s) for s in search], cache=cache or SummaryCache(None)
    )


def _kinds(found: object) -> set[str]:
    return set(found)  # type: ignore[call-overload]


def test_open_for_writing_inside_another_call_writes(tmp_path: Path) -> None:
    p = _project(
        tmp_path,
        {
            "train.py": """
            import json

            def save(cfg, path):
                json.dump(cfg, open(path, "w"))

            def peek(path):
                return open(path).read()

            def load(path):
                with open(path, mode="r") as f:
                    return json.load(f)
            """
        },
    )
    e = _effects(p, ["train.py"])
    assert _kinds(e.function(str(p["train.py"]), "save")) == {"writes"}
    assert not e.function(str(p["train.py"]), "peek")
    assert not e.function(str(p["train.py"]), "load")


def test_a_writing_helper_in_a_sub_package_writes_and_forks(tmp_path: Path) -> None:
    p = _project(
        tmp_path,
        {
            "util/__init__.py": "",
            "util/keep.py": """
            import os, subprocess

            def keep_settings(out):
                if not os.path.isdir(out):
                    os.mkdir(out)
                subprocess.call("cp *.py " + out, shell=True)
            """,
            "train.py": """
            from util.keep import keep_settings

            def main():
                keep_settings("out")
            """,
        },
    )
    e = _effects(p, ["train.py", "util/keep.py", "util/__init__.py"])
    found = e.function(str(p["train.py"]), "main")
    assert _kinds(found) == {"writes", "forks"}
    assert found["writes"].what == "os.mkdir"
    assert found["writes"].via == ("util.keep.keep_settings",)
    assert found["forks"].what == "subprocess.call"
    at_call = e.at_lines(str(p["train.py"]), 5, 5, "keep_settings")
    assert _kinds(at_call) == {"writes", "forks"}


def test_a_method_resolves_through_the_receivers_class_in_another_module(
    tmp_path: Path,
) -> None:
    p = _project(
        tmp_path,
        {
            "nets.py": """
            import json
            import chainer

            class Net(chainer.Chain):
                def keep_layout(self, name):
                    self._write(name)

                def _write(self, name):
                    json.dump({}, open(name, "w"))

                def summary(self):
                    return "net"
            """,
            "train.py": """
            from nets import Net

            def main():
                model = Net()
                model.summary()
                model.keep_layout("m.json")
            """,
        },
    )
    # nets.py is not converted: it is read from the training script's folder
    e = _effects(p, ["train.py"])
    path = str(p["train.py"])
    assert not e.at_lines(path, 6, 6, "summary")
    writes = e.at_lines(path, 7, 7, "keep_layout")["writes"]
    assert writes.via == ("nets.Net.keep_layout", "nets.Net._write")


def test_an_attribute_held_by_self_and_an_inherited_method(tmp_path: Path) -> None:
    p = _project(
        tmp_path,
        {
            "pipeline.py": """
            import chainer
            from chainer import training

            class Base:
                def persist(self, path):
                    with open(path, "w") as f:
                        f.write("vocab")

            class Pipeline(Base):
                def __init__(self, updater):
                    self.trainer = training.Trainer(updater, (1, "epoch"))

                def fit(self):
                    self.trainer.run()

            class MyUpdater(training.updaters.StandardUpdater):
                pass

            def go(it, opt):
                p = Pipeline(MyUpdater(it, opt))
                p.persist("vocab.json")
                MyUpdater(it, opt).update()
            """
        },
    )
    e = _effects(p, ["pipeline.py"])
    path = str(p["pipeline.py"])
    assert _kinds(e.function(path, "Pipeline.fit")) == {"trains"}
    assert "writes" in e.at_lines(path, 22, 22, "persist")
    assert "trains" in e.at_lines(path, 23, 23, "update")


def test_an_installed_package_is_read_from_disk_lazily_and_never_imported(
    tmp_path: Path,
) -> None:
    p = _project(
        tmp_path,
        {
            "site/fakechem/__init__.py": "from fakechem.utils import run_fit  # re-export\n",
            "site/fakechem/utils/__init__.py": "from fakechem.utils.fit import run_fit\n",
            "site/fakechem/utils/fit.py": """
            raise RuntimeError("imported")
            from chainer import training
            from chainer.training import extensions

            def run_fit(model, it, opt):
                updater = training.StandardUpdater(it, opt)
                trainer = training.Trainer(updater, (1, "epoch"))
                trainer.extend(extensions.LogReport())
                trainer.run()
            """,
            "site/fakechem/unused.py": "x = 1\n",
            "proj/train.py": """
            import fakechem

            def main():
                fakechem.run_fit(None, None, None)
            """,
        },
    )
    e = _effects(p, ["proj/train.py"], [tmp_path / "site"])
    found = e.function(str(p["proj/train.py"]), "main")
    assert _kinds(found) == {"writes", "trains"}
    assert found["trains"].what == "chainer.training.Trainer.run"
    assert found["trains"].via == ("fakechem.run_fit",)
    assert e.resolves_outside(str(p["proj/train.py"]), 5, "run_fit") == "fakechem.utils.fit"
    assert "fakechem" not in sys.modules
    assert "fakechem.unused" not in e.modules_read  # only what calls reach


def test_sys_path_and_imports_by_name_lambdas_and_cycles(tmp_path: Path) -> None:
    p = _project(
        tmp_path,
        {
            "load.py": """
            import importlib, sys, os
            import numpy as np

            def load_module(fn):
                sys.path.insert(0, os.path.dirname(fn))
                return importlib.import_module("mod")

            def later(out):
                cb = lambda: np.save(out, 1)
                return cb

            def ping(n):
                return pong(n - 1) if n else 0

            def pong(n):
                return ping(n)
            """
        },
    )
    e = _effects(p, ["load.py"])
    path = str(p["load.py"])
    assert _kinds(e.function(path, "load_module")) == {"imports"}
    assert _kinds(e.function(path, "later")) == {"writes"}
    assert not e.function(path, "ping")


def test_data_collectives_and_training_by_receiver_name(tmp_path: Path) -> None:
    p = _project(
        tmp_path,
        {
            "train.py": """
            import chainer
            from pathlib import Path

            def data():
                return chainer.datasets.get_mnist()

            def step(optimizer, comm, loss):
                optimizer.update()
                comm.bcast_obj(loss)

            def note(d):
                Path(d).write_text("done")
            """
        },
    )
    e = _effects(p, ["train.py"])
    path = str(p["train.py"])
    assert _kinds(e.function(path, "data")) == {"reads-data"}
    assert _kinds(e.function(path, "step")) == {"trains", "collective"}
    assert _kinds(e.function(path, "note")) == {"writes"}


def test_cold_warm_and_unwritable_caches_give_the_same_answers(tmp_path: Path) -> None:
    p = _project(
        tmp_path,
        {
            "site/wpkg/__init__.py": """
            import shutil

            def snapshot(src, dst):
                shutil.copytree(src, dst)

            def outer(a):
                return snapshot(a, a + ".bak")
            """,
            "train.py": """
            from wpkg import outer

            def main():
                outer("x")
            """,
        },
    )

    def answer(cache: SummaryCache) -> list[tuple[str, str, int, tuple[str, ...]]]:
        found = _effects(p, ["train.py"], [tmp_path / "site"], cache).function(
            str(p["train.py"]), "main"
        )
        return [(k, v.what, v.line, v.via) for k, v in sorted(found.items())]

    directory = tmp_path / "cache"
    cold = SummaryCache(directory)
    first = answer(cold)
    assert cold.misses == 1 and cold.hits == 0 and list(directory.glob("*.json"))
    warm = SummaryCache(directory)
    assert answer(warm) == first and warm.hits == 1 and warm.misses == 0
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory should be")
    assert answer(SummaryCache(blocked / "sub")) == first
    assert first == [("writes", "shutil.copytree", 5, ("wpkg.outer", "wpkg.snapshot"))]
    # a changed file is read again
    pkg = tmp_path / "site" / "wpkg" / "__init__.py"
    pkg.write_text(pkg.read_text().replace("shutil.copytree(src, dst)", "return src"))
    os.utime(pkg, ns=(1, 1))
    assert answer(SummaryCache(directory)) == []


@pytest.mark.skipif(
    not any(Path(d, "chainer_chemistry").is_dir() for d in sys.path if d),
    reason="chainer-chemistry is not installed",
)
def test_chainer_chemistry_run_train_trains_and_writes(tmp_path: Path) -> None:
    p = _project(
        tmp_path,
        {
            "train.py": """
            from chainer_chemistry.utils import run_train, save_json

            def main(model, train):
                run_train(model, train)
                save_json("config.json", {})
            """
        },
    )
    e = _effects(p, ["train.py"], [Path(d) for d in sys.path if d])
    path = str(p["train.py"])
    assert _kinds(e.at_lines(path, 5, 5, "run_train")) >= {"trains", "writes"}
    assert _kinds(e.at_lines(path, 6, 6, "save_json")) == {"writes"}


def test_what_a_function_hands_back(tmp_path: Path) -> None:
    p = _project(
        tmp_path,
        {
            "helpers.py": """
            import os

            def result_dir(base):
                os.makedirs(base)
                return base + "/run"

            def log_handle(path):
                f = open(path, "a")
                return f

            def rows(path):
                yield from open(path)

            def later(path):
                def write():
                    open(path, "w").close()
                return write
            """,
            "train.py": """
            from helpers import result_dir, log_handle, rows, later

            def main():
                out = result_dir("r")
                log = log_handle("l")
                it = rows("x")
                cb = later("y")
            """,
        },
    )
    e = _effects(p, ["train.py", "helpers.py"])
    path = str(p["train.py"])
    assert e.returns_at(path, 5, "result_dir") == [""]
    assert e.returns_at(path, 6, "log_handle") == ["builtins.open"]
    assert e.returns_at(path, 7, "rows") == ["generator"]
    assert e.returns_at(path, 8, "later") == ["function"]


def test_a_callable_held_in_a_variable_or_attribute_is_opaque(tmp_path: Path) -> None:
    """A class kept in ``self.<attr>`` and called, or a parameter called: it may train, so the
    analysis says it cannot tell (``opaque``), and ``"".format`` is never a project method."""
    p = _project(
        tmp_path,
        {
            "pipe.py": """
            import os

            class Runner:
                def __init__(self, trainer_class=None):
                    self.trainer_class = trainer_class

                def go(self, out, data):
                    os.mkdir(out)
                    run = self.trainer_class(out)
                    run(data)

            def apply(fn, x):
                return fn(x)

            class Texts:
                def format(self, path):
                    open(path, "w").close()

            def label(n):
                return "{}".format(n)
            """
        },
    )
    e = _effects(p, ["pipe.py"])
    path = str(p["pipe.py"])
    assert _kinds(e.function(path, "Runner.go")) == {"writes", "opaque"}
    assert _kinds(e.function(path, "apply")) == {"opaque"}
    assert not e.function(path, "label")
