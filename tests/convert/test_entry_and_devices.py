"""Where the communicator is created and which device each rank uses (issue 12, pattern 8).

Checked on the output's syntax tree: which block holds ``comm = ...create_communicator(...)``
and what comes right before it; and by running what was emitted: the communicator name
expression is evaluated, and the device remap executed, with the argparse values a command line
gives, so "chooses ``pure_nccl`` when ``--gpus 0 1``" is a result, not a substring.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import textwrap
from types import SimpleNamespace
from typing import Any

import chainer
import pytest

from mnify.converter.driver import FileResult
from tests.convert.ast_checks import assert_no_expression
from tests.convert.converting import convert

HEAD = """\
import argparse
import chainer
import chainer.links as L
from chainer import training
from chainer.training import extensions

"""

TRAINING = """\
    model = L.Classifier(L.Linear(3, 2))
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
"""


@dataclasses.dataclass
class Site:
    """Where the communicator is created: the assignment, the block holding it, its index."""

    assign: ast.Assign
    owner: ast.AST  # ast.FunctionDef, ast.If (the main guard) or ast.Module
    body: list[ast.stmt]
    index: int

    @property
    def before(self) -> ast.stmt | None:
        return self.body[self.index - 1] if self.index else None

    @property
    def after(self) -> ast.stmt:
        return self.body[self.index + 1]

    @property
    def name_expr(self) -> ast.expr:
        call = self.assign.value
        assert isinstance(call, ast.Call)
        return call.args[0]


def _blocks(node: ast.AST) -> list[tuple[ast.AST, list[ast.stmt]]]:
    found: list[tuple[ast.AST, list[ast.stmt]]] = []
    for child in ast.walk(node):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(child, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                found.append((child, body))
    return found


def comm_site(text: str) -> Site:
    tree = ast.parse(text)
    sites = [
        Site(stmt, owner, body, i)
        for owner, body in _blocks(tree)
        for i, stmt in enumerate(body)
        if isinstance(stmt, ast.Assign)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and stmt.value.func.attr == "create_communicator"
    ]
    assert len(sites) == 1, f"{len(sites)} communicators in:\n{text}"
    return sites[0]


def function(text: str, name: str) -> ast.FunctionDef:
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"no function {name}")


def names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


# -------------------------------------------------------------- running what was emitted
class FakeGpuDevice:
    def __init__(self, index: int) -> None:
        self.index = index


class FakeChainer:
    """``chainer`` as the emitted code uses it, with GPUs: ``get_device`` follows Chainer 7's
    rules for GPU specifiers and hands CPU ones to the real Chainer."""

    def __init__(self) -> None:
        self.backend = SimpleNamespace(GpuDevice=FakeGpuDevice)
        self.used: list[int] = []
        self.backends = SimpleNamespace(cuda=SimpleNamespace(get_device_from_id=self._from_id))

    def get_device(self, spec: object) -> object:
        text = str(spec)
        if text.startswith("@cupy:"):
            return FakeGpuDevice(int(text.split(":")[1]))
        if text.lstrip("-").isdigit() and int(text) >= 0:
            return FakeGpuDevice(int(text))
        return chainer.get_device(spec)

    def _from_id(self, index: int) -> SimpleNamespace:
        return SimpleNamespace(use=lambda: self.used.append(index))


def chosen(site: Site, namespace: str = "args", **values: Any) -> str:
    """The communicator the emitted expression names for these argparse values."""
    expr = ast.Expression(site.name_expr)
    scope = {namespace: SimpleNamespace(**values)}
    return str(eval(compile(expr, "<comm>", "eval"), {"chainer": FakeChainer()}, scope))


def remapped(site: Site, intra_rank: int, **values: Any) -> tuple[SimpleNamespace, FakeChainer]:
    """Run the statement after the communicator (the device remap) on one rank."""
    remap = site.after
    assert isinstance(remap, ast.If), ast.unparse(remap)
    args = SimpleNamespace(**values)
    fake = FakeChainer()
    scope = {"args": args, "comm": SimpleNamespace(intra_rank=intra_rank)}
    exec(compile(ast.Module([remap], []), "<remap>", "exec"), {"chainer": fake}, scope)
    return args, fake


def entries(result: FileResult, step: str) -> list[str]:
    return [e.message for e in result.entries if e.step == step]


# -------------------------------------------------------------- where the communicator goes
def test_helper_that_returns_args_is_not_the_home() -> None:
    result = convert(
        HEAD
        + """\
def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument('--gpu', '-g', type=int, default=-1)
    parser.add_argument('--out', default='result')
    args = parser.parse_args()
    return args


def main():
    args = get_args()
    print(args.out)
"""
        + TRAINING
        + """

if __name__ == '__main__':
    main()
""",
        idempotent=True,
    )
    text = result.output or ""
    site = comm_site(text)
    assert isinstance(site.owner, ast.FunctionDef) and site.owner.name == "main"
    assert ast.unparse(site.before or ast.Pass()) == "args = get_args()"
    assert "comm" not in names(function(text, "get_args"))
    assert not function(text, "main").args.args  # no signature changes
    assert chosen(site, gpu=-1) == "flat" and chosen(site, gpu=0) == "pure_nccl"
    message = entries(result, "communicator")[0]
    assert "main()" in message and "get_args() only parses and returns the arguments" in message


def test_namespace_followed_through_helpers_and_tuples() -> None:
    text = (
        convert(
            HEAD
            + """\
def parse():
    p = argparse.ArgumentParser()
    p.add_argument('--gpu', type=int, default=-1)
    return p.parse_args()


def load_config():
    opts = parse()
    config = {'lr': 0.1}
    return config, opts


def main():
    config, opts = load_config()
"""
            + TRAINING,
            idempotent=True,
        ).output
        or ""
    )
    site = comm_site(text)
    assert isinstance(site.owner, ast.FunctionDef) and site.owner.name == "main"
    assert ast.unparse(site.before or ast.Pass()) == "config, opts = load_config()"
    assert chosen(site, "opts", gpu=1) == "pure_nccl"
    assert remapped_namespace(site, "opts", gpu=1).gpu == 4


def remapped_namespace(site: Site, namespace: str, **values: Any) -> SimpleNamespace:
    remap = site.after
    assert isinstance(remap, ast.If)
    ns = SimpleNamespace(**values)
    scope = {namespace: ns, "comm": SimpleNamespace(intra_rank=4)}
    exec(compile(ast.Module([remap], []), "<remap>", "exec"), {"chainer": FakeChainer()}, scope)
    return ns


def test_parse_known_args_pair() -> None:
    text = (
        convert(
            HEAD
            + """\
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--gpu', type=int, default=-1)
    opts, unknown = parser.parse_known_args()
"""
            + TRAINING,
            idempotent=True,
        ).output
        or ""
    )
    site = comm_site(text)
    assert ast.unparse(site.before or ast.Pass()) == "opts, unknown = parser.parse_known_args()"
    assert chosen(site, "opts", gpu=-1) == "flat"


def test_module_level_args_handed_to_main() -> None:
    text = (
        convert(
            HEAD
            + """\
def main(opts):
    \"\"\"Train.\"\"\"
"""
            + TRAINING
            + """

if __name__ == '__main__':
    parser = argparse.ArgumentParser()
    parser.add_argument('--gpus', type=int, nargs='+', default=[-1])
    args = parser.parse_args()
    main(args)
""",
            idempotent=True,
        ).output
        or ""
    )
    site = comm_site(text)
    assert isinstance(site.owner, ast.FunctionDef) and site.owner.name == "main"
    assert site.index == 1  # right after the docstring
    assert chosen(site, "opts", gpus=[0]) == "pure_nccl"
    assert chosen(site, "opts", gpus=[-1]) == "flat"
    assert [a.arg for a in function(text, "main").args.args] == ["opts"]


def test_args_parsed_in_either_branch_get_the_communicator_after_the_if() -> None:
    text = (
        convert(
            HEAD
            + """\
def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument('--gpu', type=int, default=-1)
    if argv is None:
        args = parser.parse_args()
    else:
        args = parser.parse_args(argv)
"""
            + TRAINING,
            idempotent=True,
        ).output
        or ""
    )
    site = comm_site(text)
    assert isinstance(site.owner, ast.FunctionDef) and site.owner.name == "main"
    assert isinstance(site.before, ast.If) and ast.unparse(site.before.test) == "argv is None"


MODULE_SCRIPT = (
    HEAD
    + """\
parser = argparse.ArgumentParser()
parser.add_argument('--gpu', type=int, default=-1)
parser.add_argument('--loaderjob', type=int, default=2)
args = parser.parse_args()


def make_data(n):
    return chainer.datasets.TupleDataset([0.0] * n, [0] * n)


if __name__ == '__main__':
    train = make_data(100)
    model = L.Classifier(L.Linear(1, 2))
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    it = chainer.iterators.MultiprocessIterator(train, 10, n_processes=args.loaderjob)
"""
)


MAIN_GUARD = "__name__ == '__main__'"


def test_module_level_script_keeps_communicator_and_forkserver_in_the_main_guard() -> None:
    result = convert(MODULE_SCRIPT, idempotent=True)
    text = result.output or ""
    site = comm_site(text)
    assert isinstance(site.owner, ast.If) and ast.unparse(site.owner.test) == MAIN_GUARD
    preamble = [ast.unparse(s) for s in site.body[: site.index]]
    assert preamble[0] == "multiprocessing.set_start_method('forkserver')"
    outside = [
        s
        for s in ast.parse(text).body
        if not (isinstance(s, ast.If) and ast.unparse(s.test) == MAIN_GUARD)
    ]
    assert len(outside) == len(ast.parse(text).body) - 1
    assert all("comm" not in names(s) and "multiprocessing" not in _calls(s) for s in outside)
    assert chosen(site, gpu=-1) == "flat"
    assert "`if __name__ == '__main__':` block" in entries(result, "communicator")[0]


def _calls(node: ast.AST) -> set[str]:
    return {
        ast.unparse(n.func.value)
        for n in ast.walk(node)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    }


def test_module_level_script_without_arguments_in_the_main_guard() -> None:
    text = (
        convert(
            HEAD
            + """\
if __name__ == '__main__':
    model = L.Classifier(L.Linear(1, 2))
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
""",
            idempotent=True,
        ).output
        or ""
    )
    site = comm_site(text)
    assert isinstance(site.owner, ast.If) and site.index == 0
    assert ast.literal_eval(site.name_expr) == "flat"


# -------------------------------------------------------------- which device flag, what it selects
FLAGS = [
    # add_argument(...) arguments, a use of the flag, {value: communicator}, (value, remapped)
    (
        "'--gpus', type=int, nargs='+', default=[-1]",
        "",
        [([-1], "flat"), ([0, 1], "pure_nccl")],
        ([0, 1], [3]),
    ),
    (
        "'--gpus', type=int, nargs='*'",
        "",
        [(None, "flat"), ([], "flat"), ([2], "pure_nccl")],
        ([2], [3]),
    ),
    ("'--gpus', type=int, action='append'", "", [(None, "flat"), ([1], "pure_nccl")], ([1], [3])),
    (
        "'--gpus', nargs='+', default=['-1']",
        "",
        [(["-1"], "flat"), (["0"], "pure_nccl")],
        (["0"], ["3"]),
    ),
    ("'-g', '--gpu-device', type=int, default=-1", "", [(-1, "flat"), (1, "pure_nccl")], (1, 3)),
    ("'-g', type=int, default=-1", "", [(-1, "flat"), (0, "pure_nccl")], (0, 3)),
    ("'--gpu_id', type=int, default=-1", "", [(-1, "flat"), (0, "pure_nccl")], (0, 3)),
    (
        "'--gpu', type=int, nargs='?', const=0, default=-1",
        "",
        [(-1, "flat"), (0, "pure_nccl")],
        (0, 3),
    ),
    ("'--gpu', type=int, nargs='?', const=0", "", [(None, "flat"), (0, "pure_nccl")], (0, 3)),
    ("'--gpu', default=-1", "", [(-1, "flat"), ("0", "pure_nccl")], ("0", 3)),
    (
        "'--device', type=str, default='-1'",
        "",
        [("-1", "flat"), ("@numpy", "flat"), ("@cupy:1", "pure_nccl"), ("0", "pure_nccl")],
        ("@cupy:1", "@cupy:3"),
    ),
    (
        "'--device', '-d', default='@numpy'",
        "",
        [("@numpy", "flat"), ("@cupy:0", "pure_nccl")],
        ("@cupy:0", "@cupy:3"),
    ),
    (
        "'--gpus', type=str, default='-1'",
        "    devices = [int(d) for d in args.gpus.split(',')]\n",
        [("-1", "flat"), ("0,1", "pure_nccl")],
        ("0,1", "3"),
    ),
    (
        "'--use-device', type=int, default=-1",
        "    model.to_gpu(args.use_device)\n",
        [(-1, "flat"), (0, "pure_nccl")],
        (0, 3),
    ),
]


@pytest.mark.parametrize(("flag", "use", "selects", "remap"), FLAGS, ids=[f[0] for f in FLAGS])
def test_device_flag_decides_the_communicator_and_each_ranks_gpu(
    flag: str, use: str, selects: list[tuple[Any, str]], remap: tuple[Any, Any]
) -> None:
    result = convert(
        HEAD
        + f"""\
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument({flag})
    args = parser.parse_args()
    model = L.Classifier(L.Linear(3, 2))
{use}    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
""",
        idempotent=True,
    )
    text = result.output or ""
    site = comm_site(text)
    dest = ast.parse(f"f({flag})").body[0]
    options = [a.value for a in dest.value.args]  # type: ignore[attr-defined]
    longs = [o for o in options if o.startswith("--")]
    attr = (longs or options)[0].lstrip("-").replace("-", "_")
    for value, name in selects:
        assert chosen(site, **{attr: value}) == name, (value, ast.unparse(site.name_expr))
    given, expected = remap
    args, _ = remapped(site, 3, **{attr: given})
    assert getattr(args, attr) == expected
    cpu_value = selects[0][0]
    assert getattr(remapped(site, 3, **{attr: cpu_value})[0], attr) == cpu_value  # CPU stays
    assert_no_expression(text, "'naive'")
    option = (longs or options)[0]
    assert any(f"when {option} selects one" in m for m in entries(result, "device"))


def test_on_off_gpu_switch_makes_the_ranks_gpu_current() -> None:
    text = (
        convert(
            HEAD
            + """\
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--gpu', action='store_true')
    args = parser.parse_args()
"""
            + TRAINING,
            idempotent=True,
        ).output
        or ""
    )
    site = comm_site(text)
    assert chosen(site, gpu=False) == "flat" and chosen(site, gpu=True) == "pure_nccl"
    assert remapped(site, 2, gpu=True)[1].used == [2]
    assert remapped(site, 2, gpu=False)[1].used == []


def test_target_chainermn_gives_cpu_runs_naive() -> None:
    text = (
        convert(
            HEAD
            + """\
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--gpu', type=int, default=-1)
    args = parser.parse_args()
"""
            + TRAINING,
            target="chainermn",
            idempotent=True,
        ).output
        or ""
    )
    site = comm_site(text)
    assert chosen(site, gpu=-1) == "naive"  # ChainerMN's flat packs in GPU memory
    assert chosen(site, gpu=0) == "pure_nccl"


def test_communicator_option_overrides() -> None:
    text = (
        convert(
            HEAD
            + """\
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--gpus', type=int, nargs='+', default=[-1])
    args = parser.parse_args()
"""
            + TRAINING,
            communicator="hierarchical",
            idempotent=True,
        ).output
        or ""
    )
    site = comm_site(text)
    assert ast.literal_eval(site.name_expr) == "hierarchical"
    assert remapped(site, 1, gpus=[0, 1])[0].gpus == [1]  # still one GPU per rank


@pytest.mark.parametrize(
    ("body", "name"),
    [
        ("    model = L.Classifier(L.Linear(3, 2))\n    model.to_gpu()\n", "pure_nccl"),
        ("    model = L.Classifier(L.Linear(3, 2))\n", "flat"),
    ],
    ids=["gpu-without-a-flag", "cpu-only"],
)
def test_without_a_device_flag(body: str, name: str) -> None:
    text = (
        convert(
            HEAD + "def main():\n" + body + "    optimizer = chainer.optimizers.SGD()\n",
            idempotent=True,
        ).output
        or ""
    )
    assert ast.literal_eval(comm_site(text).name_expr) == name


# -------------------------------------------------------------- multi-GPU updaters, helpers
def _gpus_script(updater_block: str) -> str:
    return (
        HEAD
        + """\
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--gpus', type=int, nargs='*', default=[-1])
    args = parser.parse_args()
    model = L.Classifier(L.Linear(3, 2))
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    train = chainer.datasets.TupleDataset([0.0] * 8, [0] * 8)
    train_iter = chainer.iterators.SerialIterator(train, 4)
"""
        + updater_block
    )


def test_parallel_updater_behind_a_gpu_count_test_is_not_reached() -> None:
    result = convert(
        _gpus_script(
            """\
    if len(args.gpus) > 1:
        devices = {'main': args.gpus[0], 'second': args.gpus[1]}
        updater = training.updaters.ParallelUpdater(train_iter, optimizer, devices=devices)
    else:
        updater = training.StandardUpdater(train_iter, optimizer, device=args.gpus[0])
"""
        ),
        idempotent=True,
    )
    (message,) = [m for m in entries(result, "device") if "ParallelUpdater" in m]
    assert "not reached" in message
    assert not [e for e in result.entries if e.severity == "needs-person" and e.step == "device"]


def test_parallel_updater_always_built_needs_a_person() -> None:
    result = convert(
        _gpus_script(
            """\
    devices = {'main': args.gpus[0], 'second': args.gpus[1]}
    updater = training.updaters.ParallelUpdater(train_iter, optimizer, devices=devices)
"""
        ),
        idempotent=True,
    )
    people = [e.message for e in result.entries if e.severity == "needs-person"]
    assert any("ParallelUpdater drives several GPUs" in m for m in people)


def test_device_parameter_of_a_helper_is_its_callers_business() -> None:
    result = convert(
        HEAD
        + """\
class Evaluator(extensions.Evaluator):
    def __init__(self, iterator, target, device=None):
        super(Evaluator, self).__init__(iterator, target, device=device)


def to_device(model, gpu=0):
    model.to_gpu(gpu)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--gpu', type=int, default=-1)
    args = parser.parse_args()
"""
        + TRAINING
        + """\
    to_device(model)
""",
        idempotent=True,
    )
    people = [e.message for e in result.entries if e.severity == "needs-person"]
    assert not any("super(Evaluator" in m for m in people)  # device=None: the caller's
    assert any("model.to_gpu(gpu)" in m for m in people)  # gpu=0: every caller's GPU 0


def test_device_constant_in_the_code_picks_the_communicator_after_it_is_set() -> None:
    """Issue 22: ``gpu = -1`` in main (no argparse): the communicator is created right after
    that line and chooses from it at run time; a GPU run re-points it to the rank's GPU."""
    result = convert(
        """\
        import chainer
        import chainer.links as L
        from chainer import training


        def main():
            print('start')
            gpu = -1
            train, test = chainer.datasets.get_mnist()
            model = L.Classifier(L.Linear(784, 10))
            if gpu >= 0:
                chainer.cuda.get_device_from_id(gpu).use()
                model.to_gpu()
            opt = chainer.optimizers.Adam()
            opt.setup(model)
            it = chainer.iterators.SerialIterator(train, 100)
            updater = training.StandardUpdater(it, opt, device=gpu)
            training.Trainer(updater, (1, 'epoch')).run()


        main()
        """
    )
    main = next(s for s in ast.parse(result.output or "").body if isinstance(s, ast.FunctionDef))
    body = [ast.unparse(s) for s in main.body]
    at = body.index("gpu = -1")
    assert body[at + 1] == "comm = mn.create_communicator('pure_nccl' if gpu >= 0 else 'flat')"
    assert body[at + 2] == "if gpu >= 0:\n    gpu = comm.intra_rank"
    assert body[at - 1] == "print('start')"  # runs before comm exists: no guard reads it


# -------------------------------------------------------------- a device read from a config
def _choose_with(site: Site, scope: dict[str, Any]) -> str:
    """The communicator the emitted expression names with ``scope``'s values (a config)."""
    expr = ast.Expression(site.name_expr)
    return str(eval(compile(expr, "<comm>", "eval"), {"chainer": FakeChainer()}, dict(scope)))


def _remap_with(site: Site, intra_rank: int, scope: dict[str, Any]) -> dict[str, Any]:
    """Run the device remap after the communicator on one rank; the scope afterwards."""
    remap = site.after
    assert isinstance(remap, ast.If), ast.unparse(remap)
    local = {**scope, "comm": SimpleNamespace(intra_rank=intra_rank)}
    exec(compile(ast.Module([remap], []), "<remap>", "exec"), {"chainer": FakeChainer()}, local)
    return local


def _device_people(result: FileResult) -> list[str]:
    return [e.message for e in result.entries if e.severity == "needs-person" and e.code == "MN103"]


def test_a_device_read_from_a_loaded_config_picks_the_communicator_once_it_is_loaded() -> None:
    """Issue 31, item 7 (b): ``settings["gpu"]`` of a JSON config, no device flag. The
    communicator is created after the statement that loads the config and chooses from the
    value at run time; a GPU run re-points the entry to the rank's GPU, so every use of it
    (``get_device_from_id(settings["gpu"])``, ``device=settings["gpu"]``) follows."""
    result = convert(
        """\
        import json
        import sys

        import chainer
        import chainer.links as L
        from chainer import training


        def main():
            with open(sys.argv[1]) as f:
                settings = json.load(f)
            model = L.Classifier(L.Linear(4, 2))
            if settings["gpu"] >= 0:
                chainer.backends.cuda.get_device_from_id(settings["gpu"]).use()
                model.to_gpu()
            opt = chainer.optimizers.SGD()
            opt.setup(model)
            train, _ = chainer.datasets.get_mnist()
            it = chainer.iterators.SerialIterator(train, 8)
            updater = training.updaters.StandardUpdater(it, opt, device=settings["gpu"])
            training.Trainer(updater, (1, 'epoch')).run()


        if __name__ == '__main__':
            main()
        """,
        idempotent=True,
    )
    text = result.output or ""
    site = comm_site(text)
    assert isinstance(site.owner, ast.FunctionDef) and site.owner.name == "main"
    assert isinstance(site.before, ast.With) and site.index == 1
    assert _choose_with(site, {"settings": {"gpu": -1}}) == "flat"
    assert _choose_with(site, {"settings": {"gpu": 0}}) == "pure_nccl"
    assert _remap_with(site, 3, {"settings": {"gpu": 0}})["settings"] == {"gpu": 3}
    assert _remap_with(site, 3, {"settings": {"gpu": -1}})["settings"] == {"gpu": -1}
    assert not _device_people(result)


CONFIG_READS = [
    # the entry point's code, the config's name and values on a CPU and a GPU run, what a GPU
    # run of rank 3 leaves in it, and the statement right before the communicator (None: it
    # is the first statement of main)
    pytest.param(
        """\
        def main(cfg):
            print('training')
            model = L.Classifier(L.Linear(4, 2))
            if cfg.gpu >= 0:
                chainer.cuda.get_device_from_id(cfg.gpu).use()
                model.to_gpu()
        """,
        "cfg",
        (SimpleNamespace(gpu=-1), SimpleNamespace(gpu=1)),
        SimpleNamespace(gpu=3),
        None,
        id="attribute-of-a-parameter",
    ),
    pytest.param(
        """\
        def main():
            config = load_config('config.json')
            device = chainer.get_device(config['device'])
            device.use()
            model = L.Classifier(L.Linear(4, 2))
            model.to_device(device)
        """,
        "config",
        ({"device": "@numpy"}, {"device": "@cupy:1"}),
        {"device": "@cupy:3"},
        "config = load_config('config.json')",
        id="device-specifier",
    ),
    pytest.param(
        """\
        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument('--config', default='config.json')
            args = parser.parse_args()
            with open(args.config) as f:
                cfg = json.load(f)
            gpu = int(cfg['gpu'])
            model = L.Classifier(L.Linear(4, 2))
            model.to_gpu(gpu)
        """,
        "cfg",
        ({"gpu": "-1"}, {"gpu": "0"}),
        {"gpu": 3},
        "with open(args.config) as f:\n    cfg = json.load(f)",
        id="read-with-int-after-the-arguments",
    ),
    pytest.param(
        """\
        def main():
            with open('config.json') as f:
                gpu = json.load(f)['gpu']
            model = L.Classifier(L.Linear(4, 2))
            model.to_gpu(gpu)
        """,
        "gpu",
        (-1, 0),
        3,
        "with open('config.json') as f:\n    gpu = json.load(f)['gpu']",
        id="variable-set-from-a-config",
    ),
]


@pytest.mark.parametrize(("code", "name", "values", "remapped_to", "before"), CONFIG_READS)
def test_a_device_read_in_the_code_picks_the_communicator_and_each_ranks_gpu(
    code: str, name: str, values: tuple[Any, Any], remapped_to: Any, before: str | None
) -> None:
    head = "import argparse\nimport json\n\nimport chainer\nimport chainer.links as L\n\n\n"
    helper = "def load_config(path):\n    with open(path) as f:\n        return json.load(f)\n\n\n"
    training = (
        "    opt = chainer.optimizers.SGD()\n"
        "    opt.setup(model)\n"
        "    train, _ = chainer.datasets.get_mnist()\n"
        "    it = chainer.iterators.SerialIterator(train, 8)\n"
    )
    result = convert(head + helper + textwrap.dedent(code) + training, idempotent=True)
    site = comm_site(result.output or "")
    assert isinstance(site.owner, ast.FunctionDef) and site.owner.name == "main"
    if before is None:
        assert site.index == 0
    else:
        assert ast.unparse(site.before or ast.Pass()) == before
    cpu, gpu = values
    assert _choose_with(site, {name: copy.deepcopy(cpu)}) == "flat"
    assert _choose_with(site, {name: copy.deepcopy(gpu)}) == "pure_nccl"
    assert _remap_with(site, 3, {name: copy.deepcopy(gpu)})[name] == remapped_to
    assert _remap_with(site, 3, {name: copy.deepcopy(cpu)})[name] == cpu  # CPU stays
    assert not _device_people(result)


def test_an_int_of_a_string_device_flag_still_follows_the_flag() -> None:
    """``gpu = int(args.gpu_id)`` of ``--gpu-id`` (a string): the flag decides, as before."""
    text = (
        convert(
            HEAD
            + """\
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--gpu-id', default='-1')
    args = parser.parse_args()
    gpu = int(args.gpu_id)
    model = L.Classifier(L.Linear(3, 2))
    if gpu >= 0:
        chainer.cuda.get_device_from_id(gpu).use()
        model.to_gpu()
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
""",
            idempotent=True,
        ).output
        or ""
    )
    site = comm_site(text)
    assert ast.unparse(site.before or ast.Pass()) == "args = parser.parse_args()"
    assert chosen(site, gpu_id="-1") == "flat" and chosen(site, gpu_id="0") == "pure_nccl"
    assert remapped(site, 3, gpu_id="0")[0].gpu_id == "3"


def test_a_device_whose_source_cannot_be_found_still_needs_a_person() -> None:
    result = convert(
        """\
        import chainer
        import chainer.links as L


        def pick_gpu():
            return 0


        def main():
            model = L.Classifier(L.Linear(4, 2))
            chainer.cuda.get_device_from_id(pick_gpu()).use()
            model.to_gpu()
            opt = chainer.optimizers.SGD()
            opt.setup(model)
        """
    )
    (message,) = _device_people(result)
    assert "get_device_from_id(pick_gpu())" in message
