"""Issue 31, item 7 (a): a call builds an optimizer when what its callee resolves to is one of
Chainer's optimizers or derives from one (through the script's imports, the project's modules and
the packages read from source: mnify/program/effects.py), never because of its name. Asserted
on the output's AST and the report's entries."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnify.rewrites.result import FileResult
from tests.convert.converting import convert_tree, install_package, main_body

# the project's own Adam: Chainer's, with a default learning rate of its choosing
OPTIM = """\
import chainer


class Adam(chainer.optimizers.Adam):
    def __init__(self, alpha=0.0005):
        super(Adam, self).__init__(alpha=alpha)
"""

# a project module whose classes only share names with Chainer's optimizers
SCHEDULES = """\
class MomentumSGD(object):
    \"\"\"A momentum schedule: how the momentum grows over the first epochs.\"\"\"

    def __init__(self, start, end):
        self.start, self.end = start, end

    def setup(self, model):
        self.model = model
"""

TRAIN = """\
import argparse

import chainer
import chainer.links as L
from chainer import training
{imports}


class SGD(object):
    \"\"\"Not Chainer's: it keeps the learning rates tried so far.\"\"\"

    def __init__(self, lr):
        self.rates = [lr]

    def setup(self, model):
        self.model = model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--gpu', type=int, default=-1)
    args = parser.parse_args()
    model = L.Classifier(L.Linear(4, 2))
    tried = SGD(0.1)
    tried.setup(model)
{build}
    train, _ = chainer.datasets.get_mnist()
    it = chainer.iterators.SerialIterator(train, 16)
    updater = training.updaters.StandardUpdater(it, opt, device=args.gpu)
    training.Trainer(updater, (1, 'epoch')).run()


if __name__ == '__main__':
    main()
"""

# a package's optimizer two classes away from Chainer's, exported by its __init__
PACKAGE = {
    "optkit/__init__.py": "from optkit.warm import WarmMomentum\n",
    "optkit/clipped.py": """
        from chainer import optimizers


        class ClippedMomentum(optimizers.MomentumSGD):
            def __init__(self, lr=0.01, momentum=0.9, clip=5.0):
                super().__init__(lr=lr, momentum=momentum)
                self.clip = clip
        """,
    "optkit/warm.py": """
        from .clipped import ClippedMomentum


        class WarmMomentum(ClippedMomentum):
            pass
        """,
}


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return install_package(tmp_path / "site", PACKAGE, monkeypatch)


def _people(result: FileResult) -> list[str]:
    return [f"{e.code} {e.message}" for e in result.entries if e.severity == "needs-person"]


def test_the_projects_subclass_of_a_chainer_optimizer_is_made_multi_node() -> None:
    """``from optim import Adam``, the project's subclass of Chainer's Adam: gradients must be
    averaged like Chainer's own; the file's class named ``SGD`` builds no optimizer."""
    train = TRAIN.format(
        imports="from optim import Adam",
        build="    opt = Adam(alpha=0.001)\n    opt.setup(model)",
    )
    results = convert_tree({"proj/train.py": train, "proj/optim.py": OPTIM})
    result = results["proj/train.py"]
    body = main_body(result.output)
    assert "opt = mn.create_multi_node_optimizer(Adam(alpha=0.001), comm)" in body
    assert "tried = SGD(0.1)" in body
    assert not _people(result)
    assert not results["proj/optim.py"].changed


def test_a_packages_optimizer_derived_from_chainers_is_made_multi_node(package: Path) -> None:
    """Through the package's ``__init__``, a relative import and two subclasses; built in a
    helper that returns it, so it is wrapped where ``main`` calls the helper."""
    train = TRAIN.format(
        imports="from optkit import WarmMomentum",
        build="    opt = make_optimizer(model)",
    ).replace(
        "\n\ndef main():",
        "\n\ndef make_optimizer(model):\n    opt = WarmMomentum(lr=0.1)\n"
        "    opt.setup(model)\n    return opt\n\n\ndef main():",
    )
    result = convert_tree({"pkgs/train.py": train})["pkgs/train.py"]
    body = main_body(result.output)
    assert "opt = mn.create_multi_node_optimizer(make_optimizer(model), comm)" in body
    assert main_body(result.output, "make_optimizer")[0] == "opt = WarmMomentum(lr=0.1)"
    assert not _people(result)


def test_classes_named_like_chainers_optimizers_are_not_taken_for_them() -> None:
    """The file's own ``SGD`` shadows the ``SGD`` it imports from Chainer, and the project's
    ``MomentumSGD`` is a schedule: neither is wrapped (wrapping them would break the run), and
    nobody is asked to wrap them; Chainer's Adam next to them is wrapped."""
    train = TRAIN.format(
        imports="from chainer.optimizers import SGD\nfrom kit.schedules import MomentumSGD",
        build=(
            "    momentum = MomentumSGD(0.5, 0.9)\n    momentum.setup(model)\n"
            "    opt = chainer.optimizers.Adam()\n    opt.setup(model)"
        ),
    )
    results = convert_tree(
        {"own/train.py": train, "own/kit/__init__.py": "", "own/kit/schedules.py": SCHEDULES}
    )
    result = results["own/train.py"]
    body = main_body(result.output)
    assert "tried = SGD(0.1)" in body
    assert "momentum = MomentumSGD(0.5, 0.9)" in body
    assert "opt = mn.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)" in body
    assert not _people(result)
    # the input's lint counts one optimizer to make multi-node: Chainer's Adam
    lines = train.splitlines()
    found = [lines[e.line - 1].strip() for e in result.found if e.code == "MN503"]
    assert found == ["opt = chainer.optimizers.Adam()"]


def test_the_scripts_own_optimizer_built_on_chainers_gradient_method_is_made_multi_node() -> None:
    """A hand-written optimizer (``class Lion(optimizer.GradientMethod)``) averages nothing by
    itself either: Chainer's base classes of optimizers make one too."""
    own = """\
from chainer import optimizer


class LionRule(optimizer.UpdateRule):
    def update_core_cpu(self, param):
        param.data -= self.hyperparam.lr * param.grad


class Lion(optimizer.GradientMethod):
    def __init__(self, lr=0.01):
        super(Lion, self).__init__()
        self.hyperparam.lr = lr

    def create_update_rule(self):
        return LionRule(self.hyperparam)
"""
    train = TRAIN.format(imports=own, build="    opt = Lion(lr=0.1)\n    opt.setup(model)")
    result = convert_tree({"own_opt/train.py": train})["own_opt/train.py"]
    body = main_body(result.output)
    assert "opt = mn.create_multi_node_optimizer(Lion(lr=0.1), comm)" in body
    assert "tried = SGD(0.1)" in body
    assert not _people(result)
