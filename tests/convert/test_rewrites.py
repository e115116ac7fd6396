"""Single rewrites on small sources: the idioms each step must handle, and what it reports."""

from __future__ import annotations

import ast
from pathlib import Path

from mnify.converter import ConvertOptions, convert_source, convert_sources
from mnify.converter.driver import FileResult
from tests.convert.ast_checks import (
    assert_has_expression,
    assert_has_statement,
    assert_no_name,
)
from tests.convert.converting import convert


def people(result: FileResult) -> list[str]:
    return [e.message for e in result.entries if e.severity == "needs-person"]


HEAD = """\
import argparse
import chainer
import chainer.links as L
from chainer import cuda

"""


def test_literal_gpu_ids_become_intra_rank() -> None:
    result = convert(
        HEAD
        + """\
def main():
    model = L.Classifier(L.Linear(3, 2))
    cuda.get_device_from_id(0).use()
    model.to_gpu(0)
    opt = chainer.optimizers.SGD()
"""
    )
    text = result.output or ""
    assert_has_statement(text, "cuda.get_device_from_id(comm.intra_rank).use()", within="main")
    assert_has_statement(text, "model.to_gpu(comm.intra_rank)", within="main")
    assert_has_statement(text, "comm = mn.create_communicator('pure_nccl')")  # GPU-only script


def test_bare_to_gpu_without_a_current_device_gets_the_ranks_gpu() -> None:
    result = convert(
        HEAD
        + """\
def main():
    model = L.Linear(3, 2)
    model.to_gpu()
    opt = chainer.optimizers.SGD()
"""
    )
    text = result.output or ""
    assert_has_statement(text, "model.to_gpu(comm.intra_rank)", within="main")


def test_unknown_device_idiom_is_reported_not_guessed() -> None:
    result = convert(
        HEAD
        + """\
def main():
    model = L.Linear(3, 2)
    model.to_gpu(pick_free_gpu())
    opt = chainer.optimizers.SGD()
"""
    )
    assert_has_statement(result.output or "", "model.to_gpu(pick_free_gpu())", within="main")
    assert any("device idiom not understood" in m for m in people(result))


def test_cpu_only_script_gets_the_cpu_communicator() -> None:
    result = convert(
        HEAD
        + """\
def main():
    model = L.Linear(3, 2)
    opt = chainer.optimizers.SGD()
"""
    )
    text = result.output or ""
    assert_has_statement(text, "comm = mn.create_communicator('flat')", within="main")


def test_store_true_gpu_flag_chooses_at_run_time() -> None:
    result = convert(
        HEAD
        + """\
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--gpu', action='store_true')
    args = parser.parse_args()
    opt = chainer.optimizers.SGD()
"""
    )
    text = result.output or ""
    assert_has_statement(
        text, "comm = mn.create_communicator('pure_nccl' if args.gpu else 'flat')", within="main"
    )


def test_optimizer_built_in_a_method_is_reported() -> None:
    result = convert(
        HEAD
        + """\
class Maker:
    def build(self):
        return chainer.optimizers.Adam()


def main():
    parser = argparse.ArgumentParser()
    args = parser.parse_args()
    opt = Maker().build()
"""
    )
    assert_has_statement(result.output or "", "return chainer.optimizers.Adam()", within="build")
    assert_has_statement(result.output or "", "opt = Maker().build()", within="main")
    assert any("wrap it with mn.create_multi_node_optimizer" in m for m in people(result))


def test_noqa_keeps_one_step_off_a_line() -> None:
    result = convert(
        HEAD
        + """\
def main():
    opt = chainer.optimizers.SGD()  # noqa: MN803
    other = chainer.optimizers.Adam()
"""
    )
    text = result.output or ""
    (kept,) = assert_has_statement(text, "opt = chainer.optimizers.SGD()", within="main")
    assert text.splitlines()[kept.lineno - 1].endswith("  # noqa: MN803")
    assert_has_statement(
        text, "other = mn.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)"
    )


def test_library_model_with_batchnorm_is_wrapped_at_construction() -> None:
    result = convert(
        HEAD
        + """\
def main():
    model = L.Classifier(L.ResNet50Layers(None))
    opt = chainer.optimizers.SGD()
"""
    )
    text = result.output or ""
    assert_has_statement(
        text,
        """\
        model = L.Classifier(L.ResNet50Layers(None))
        model = mn.links.create_mnbn_model(model, comm)
        """,
        within="main",
    )


def test_model_from_an_unconverted_sibling_uses_create_mnbn_model(tmp_path: Path) -> None:
    (tmp_path / "net.py").write_text(
        "import chainer.links as L\nclass Net:\n    def __init__(self):\n        self.bn = L.BatchNormalization(3)\n"
    )
    train = tmp_path / "train.py"
    source = "import chainer\nfrom net import Net\n\ndef main():\n    model = Net()\n    opt = chainer.optimizers.SGD()\n"
    result = convert_sources({str(train): source})[0]
    assert_has_statement(
        result.output or "",
        "model = Net()\nmodel = mn.links.create_mnbn_model(model, comm)",
        within="main",
    )


def test_fork_hazards_are_reported() -> None:
    result = convert(
        HEAD
        + """\
import subprocess
import os

def main():
    opt = chainer.optimizers.SGD()
    subprocess.run(['nvidia-smi'])
    os.system('ls')
"""
    )
    hazards = [m for m in people(result) if "fork" in m or "under MPI" in m]
    assert len(hazards) == 2


def test_module_level_script_without_argparse() -> None:
    result = convert(
        """\
        import chainer
        model = chainer.links.Linear(3, 2)
        optimizer = chainer.optimizers.SGD()
        optimizer.setup(model)
        print('ready')
        """
    )
    text = result.output or ""
    assert [ast.unparse(s) for s in ast.parse(text).body[:3]] == [
        "import chainer",
        "from mnify import runtime as mn",
        "comm = mn.create_communicator('flat')",
    ]
    assert_has_statement(text, "if comm.rank == 0:\n    print('ready')")


def test_unparsable_source_reports_line_and_column() -> None:
    result = convert_source("x = (1,\n", "bad.py")
    assert result.output is None
    assert result.error is not None and result.error.split(":")[0].isdigit()


def _main_of(text: str) -> ast.FunctionDef:
    return next(
        s for s in ast.parse(text).body if isinstance(s, ast.FunctionDef) and s.name == "main"
    )


def test_optimizer_built_by_a_helper_of_a_helper_is_wrapped_where_main_calls_it() -> None:
    source = (
        HEAD
        + """\
def make_optimizer(model):
    opt = chainer.optimizers.Adam()
    opt.setup(model)
    return opt


def setup(model):
    return make_optimizer(model)


def main():
    parser = argparse.ArgumentParser()
    args = parser.parse_args()
    model = L.Linear(3, 2)
    opt = setup(model)
"""
    )
    text = convert(source).output or ""
    tree = ast.parse(text)
    helpers = {s.name: s for s in tree.body if isinstance(s, ast.FunctionDef)}
    original = {s.name: s for s in ast.parse(source).body if isinstance(s, ast.FunctionDef)}
    for name in ("make_optimizer", "setup"):  # no signature or body changes
        assert ast.dump(helpers[name]) == ast.dump(original[name])
    last = _main_of(text).body[-1]
    assert ast.unparse(last) == "opt = mn.create_multi_node_optimizer(setup(model), comm)"


def test_namespace_passed_straight_to_main() -> None:
    result = convert(
        HEAD
        + """\
def main(opts):
    \"\"\"Train.\"\"\"
    model = L.Linear(3, 2)
    if opts.gpu >= 0:
        model.to_gpu(opts.gpu)
    optimizer = chainer.optimizers.SGD()


if __name__ == '__main__':
    parser = argparse.ArgumentParser()
    parser.add_argument('--gpu', type=int, default=-1)
    main(parser.parse_args())
"""
    )
    text = result.output or ""
    main = _main_of(text)
    assert ast.get_docstring(main) == "Train."
    creation = assert_has_statement(
        text,
        """\
        comm = mn.create_communicator('pure_nccl' if opts.gpu >= 0 else 'flat')
        if opts.gpu >= 0:
            opts.gpu = comm.intra_rank
            ...
        """,
        within="main",
    )
    assert creation[0].lineno == main.body[1].lineno  # right after the docstring


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "convert"


def test_strong_scaling_divides_the_training_batch_once() -> None:
    source = (FIXTURES / "mnist_mlp.in.py").read_text(encoding="utf-8")
    options = ConvertOptions(scaling="strong")
    first = convert_source(source, "mnist.py", options)
    text = first.output or ""
    assert_has_statement(
        text,
        """\
        if args.batchsize % comm.size != 0:
            raise ValueError(...)
        """,
        within="main",
    )
    assert_has_statement(
        text,
        "train_iter = chainer.iterators.SerialIterator(train, args.batchsize // comm.size)",
        within="main",
    )
    # the evaluation batch is untouched
    assert_has_statement(
        text,
        "test_iter = chainer.iterators.SerialIterator("
        "test, args.batchsize, repeat=False, shuffle=False)",
        within="main",
    )
    again = convert_source(text, "mnist.py", options)
    assert again.output == text


def test_model_parallel_report_says_why_each_conv_was_or_was_not_split() -> None:
    source = (FIXTURES / "model_parallel_cnn.in.py").read_text(encoding="utf-8")
    result = convert_source(source, "cnn.py", ConvertOptions(model_parallel="channel"))
    notes = [e.message for e in result.entries if e.step == "model-parallel"]
    convs = [m for m in notes if "Convolution2D(" in m]
    assert len(convs) == 4
    # conv1..conv3 split by their output channels (conv1's single input channel is no obstacle)
    assert sum(m.startswith("split where its model is built") for m in convs) == 3
    assert any("inferred lazily" in m for m in convs)
    one_out = source.replace("L.Convolution2D(1, ch, 3, 1, 1)", "L.Convolution2D(1, 1, 3, 1, 1)")
    assert one_out != source
    result = convert_source(one_out, "cnn.py", ConvertOptions(model_parallel="channel"))
    notes = [e.message for e in result.entries if e.step == "model-parallel"]
    assert any("1 output channel cannot be divided" in m for m in notes)
    assert any("left unwrapped" in m for m in notes)  # the optimizer
    assert_no_name(result.output or "", "scatter_dataset")


def test_model_parallel_with_chainermn_target_leaves_convs_for_a_person() -> None:
    source = (FIXTURES / "model_parallel_cnn.in.py").read_text(encoding="utf-8")
    result = convert_source(
        source, "cnn.py", ConvertOptions(model_parallel="channel", target="chainermn")
    )
    assert_no_name(result.output or "", "ParallelConvolution2D")
    assert_has_expression(
        result.output or "", "chainermn.iterators.create_multi_node_iterator(...)"
    )
    assert sum("ChainerMN has no ParallelConvolution2D" in m for m in people(result)) == 3


def test_subclasses_of_a_batchnorm_model_are_converted_where_built() -> None:
    source = (
        HEAD
        + """\
class Block(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.bn = L.BatchNormalization(3)


class Wide(Block):
    def __init__(self):
        super().__init__()


class Same(Block):
    pass


def main():
    model = Wide()
    other = Same()
    opt = chainer.optimizers.SGD()
"""
    )
    text = convert(source).output or ""
    classes = [s for s in ast.parse(text).body if isinstance(s, ast.ClassDef)]
    before = [s for s in ast.parse(source).body if isinstance(s, ast.ClassDef)]
    assert [ast.dump(c) for c in classes] == [ast.dump(c) for c in before]  # untouched
    built = [ast.unparse(s) for s in _main_of(text).body[1:3]]
    assert built == [
        "model = mn.links.create_mnbn_model(Wide(), comm)",
        "other = mn.links.create_mnbn_model(Same(), comm)",
    ]


def test_hand_written_evaluation_gets_the_whole_test_set() -> None:
    """custom_loop evaluates in a loop of its own: the test set goes whole to every rank
    (tests/convert/test_hand_evaluation.py has the cases that stay with a person)."""
    source = (FIXTURES / "custom_loop.in.py").read_text(encoding="utf-8")
    result = convert_source(source, "loop.py")
    assert "    test = comm.bcast_obj(test)\n" in (result.output or "")
    assert not any("hand-written loop" in m for m in people(result))


def test_input_libcst_parses_but_python_rejects_is_an_error() -> None:
    source = "import chainer\n\ndef main():\n    opt = chainer.optimizers.SGD()\n\nreturn 1\n"
    result = convert_source(source, "bad.py")
    assert result.output is None
    assert result.error is not None and result.error.startswith("6:")


def test_a_rewrite_bug_costs_one_file_not_the_run(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    from mnify.rewrites import registry

    def broken(ctx):  # type: ignore[no-untyped-def]
        if ctx.path == "a.py":
            raise RuntimeError("boom")

    guards = registry._REWRITES["rank0-guard"]
    monkeypatch.setitem(registry._REWRITES, "rank0-guard", dataclasses.replace(guards, plan=broken))
    src = "import chainer\n\ndef main():\n    opt = chainer.optimizers.SGD()\n"
    a, b = convert_sources({"a.py": src, "b.py": src})
    assert a.output is None and a.error is not None and "boom" in a.error
    assert b.error is None
    assert_has_expression(b.output or "", "mn.create_multi_node_optimizer(...)")


def test_tab_indented_script_keeps_tabs() -> None:
    source = (FIXTURES / "custom_loop.in.py").read_text(encoding="utf-8")
    tabbed = "\n".join(
        "\t" * ((len(line) - len(line.lstrip(" "))) // 4) + line.lstrip(" ")
        for line in source.split("\n")
    )
    compile(tabbed, "tabbed.py", "exec")
    text = convert_source(tabbed, "tabbed.py", ConvertOptions(scaling="strong")).output or ""
    compile(text, "tabbed.py", "exec")
    (guard,) = assert_has_statement(
        text,
        """\
        if comm.rank == 0:
            train, test = load_data(args.synthetic)
        else:
            train, test = None, None
        """,
        within="main",
    )
    assert isinstance(guard, ast.If)
    lines = text.splitlines()
    assert lines[guard.lineno - 1] == "\tif comm.rank == 0:"  # the inserted guard is tab-indented
    assert lines[guard.body[0].lineno - 1].startswith("\t\ttrain, test = ")


def test_chainer7_device_flag_with_deprecated_gpu_alias() -> None:
    result = convert(
        HEAD
        + """\
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--device', '-d', type=str, default='-1')
    group = parser.add_argument_group('deprecated arguments')
    group.add_argument('--gpu', '-g', dest='device', type=int, nargs='?', const=0)
    args = parser.parse_args()
    device = chainer.get_device(args.device)
    model = L.Linear(3, 2)
    model.to_device(device)
    opt = chainer.optimizers.SGD()
"""
    )
    text = result.output or ""
    assert_has_expression(
        text,
        "isinstance(chainer.get_device(args.device), chainer.backend.GpuDevice)",
        within="main",
    )
    assert_has_statement(text, "args.device = '@cupy:%d' % comm.intra_rank", within="main")
    # follows args.device: left as written
    assert_has_statement(text, "model.to_device(device)", within="main")


def test_single_node_multi_gpu_updater_needs_a_person() -> None:
    result = convert(
        HEAD
        + """\
from chainer import training

def main(train_iter, optimizer):
    updater = training.updaters.ParallelUpdater(
        train_iter, optimizer, devices={'main': 0, 'second': 1})
"""
    )
    assert any("ParallelUpdater drives several GPUs" in m for m in people(result))


def test_model_classes_keep_their_signatures_for_callers_outside_the_conversion() -> None:
    """A sibling script the user did not convert (predict.py) still builds the same classes."""
    net = (FIXTURES / "dcgan" / "in" / "net.py").read_text(encoding="utf-8")
    (result,) = convert_sources({"net.py": net})
    assert result.error is None
    assert result.output == net  # BatchNormalization is converted where the model is built


def test_model_parallel_snapshots_need_a_person() -> None:
    """Rank 0's snapshot holds only its slices of split layers: the report says so."""
    source = (FIXTURES / "model_parallel_cnn.in.py").read_text(encoding="utf-8")
    anchor = "    trainer.run()\n"
    assert anchor in source
    with_snapshot = source.replace(
        anchor, "    trainer.extend(extensions.snapshot())\n" + anchor, 1
    )
    result = convert_source(with_snapshot, "cnn.py", ConvertOptions(model_parallel="channel"))
    assert any("holds only rank 0's slices" in m for m in people(result))
    plain = convert_source(with_snapshot, "cnn.py", ConvertOptions())
    assert not any("holds only rank 0's slices" in m for m in people(plain))
