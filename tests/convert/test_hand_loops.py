"""Issue 22, part 1: hand-written training loops get their data split (asserted on the output's
AST and the report; the corpus runs them on 2 ranks and checks which examples each rank saw)."""

from __future__ import annotations

import ast
import textwrap

from mnify.converter import FileResult, convert_source
from tests.convert.converting import convert

HEAD = textwrap.dedent(
    """\
    import argparse

    import numpy as np
    import chainer
    import chainer.functions as F
    import chainer.links as L

    parser = argparse.ArgumentParser()
    parser.add_argument('--gpu', type=int, default=-1)
    args = parser.parse_args()
    """
)


def script(body: str) -> str:
    """A script: the argparse head, then ``body`` (dedented)."""
    return HEAD + textwrap.dedent(body)


def _scattered(output: str) -> list[str]:
    """Names bound to ``scatter_dataset(name, ...)``, in order."""
    found = []
    for node in ast.walk(ast.parse(output)):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func).endswith("scatter_dataset")
        ):
            arg = node.value.args[0]
            assert isinstance(arg, ast.Name)
            assert [ast.unparse(t) for t in node.targets] == [arg.id]
            keywords = {k.arg: ast.unparse(k.value) for k in node.value.keywords}
            assert keywords == {"shuffle": "True", "seed": "0"}, "arrays must shuffle alike"
            found.append(arg.id)
    return found


def _module_statements(output: str) -> list[str]:
    return [ast.unparse(s) for s in ast.parse(output).body]


PERMUTATION = """\
rng = np.random.RandomState(0)
x_all = rng.rand(120, 4).astype(np.float32)
y_all = (x_all[:, 0] > 0.5).astype(np.int32)
N = 100
x_train, x_test = x_all[:N], x_all[N:]
y_train, y_test = y_all[:N], y_all[N:]
model = L.Classifier(L.Linear(4, 2))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
for epoch in range(2):
    perm = np.random.permutation(N)
    for i in range(0, N, 10):
        x = chainer.Variable(x_train[perm[i:i + 10]])
        t = chainer.Variable(y_train[perm[i:i + 10]])
        optimizer.update(model, x, t)
    for i in range(0, len(x_test), 10):
        loss = model(x_test[i:i + 10], y_test[i:i + 10])
"""


def test_permutation_loop_scatters_the_training_arrays_and_recounts_n() -> None:
    result = convert(script(PERMUTATION))
    assert _scattered(result.output or "") == ["x_train", "y_train"]  # never the test arrays
    stmts = _module_statements(result.output or "")
    split = stmts.index("y_train = mn.scatter_dataset(y_train, comm, shuffle=True, seed=0)")
    assert stmts[split + 1] == "N = len(x_train)"
    assert stmts.index("y_train, y_test = (y_all[:N], y_all[N:])") < split
    loop = next(i for i, s in enumerate(stmts) if s.startswith("for epoch"))
    assert split < loop
    said = [e for e in result.entries if e.step == "hand-loop" and e.severity == "changed"]
    assert said and "example count (N)" in said[0].message
    assert not [e for e in result.entries if e.severity == "needs-person"]


def test_literal_count_of_a_tutorial_loop_becomes_the_share_length() -> None:
    result = convert(
        script("""\
        x_data = np.random.rand(600, 2).astype(np.float32)
        t_data = (x_data[:, 0] > 0.5).astype(np.int32)
        model = L.Classifier(L.Linear(2, 2))
        optimizer = chainer.optimizers.SGD()
        optimizer.setup(model)
        for epoch in range(5):
            perm = np.random.permutation(600)
            for i in range(0, 600, 50):
                model.cleargrads()
                loss = model(x_data[perm[i:i + 50]], t_data[perm[i:i + 50]])
                loss.backward()
                optimizer.update()
        """)
    )
    output = result.output or ""
    assert _scattered(output) == ["x_data", "t_data"]
    loop = next(s for s in ast.parse(output).body if isinstance(s, ast.For))
    calls = {ast.unparse(n) for n in ast.walk(loop) if isinstance(n, ast.Call)}
    assert "np.random.permutation(len(x_data))" in calls
    assert "range(0, len(x_data), 50)" in calls


def test_generator_arguments_are_scattered_where_the_loop_is() -> None:
    result = convert(
        script("""\
        def batches(inputs, targets, size):
            order = np.random.permutation(len(inputs))
            for k in range(0, len(inputs), size):
                pick = order[k:k + size]
                yield inputs[pick], targets[pick]


        def main():
            X = np.random.rand(50, 3).astype(np.float32)
            Y = np.zeros(50, np.int32)
            X_val = np.random.rand(10, 3).astype(np.float32)
            model = L.Classifier(L.Linear(3, 2))
            opt = chainer.optimizers.Adam()
            opt.setup(model)
            for epoch in range(3):
                for xb, yb in batches(X, Y, 8):
                    opt.update(model, xb, yb)
                print(model.predictor(X_val).shape)


        main()
        """)
    )
    assert _scattered(result.output or "") == ["X", "Y"]


def test_trainer_class_data_is_scattered_where_the_class_is_built() -> None:
    result = convert(
        script("""\
        class Fitter:
            def __init__(self, model, opt, x, y, n_batches):
                self.model, self.opt = model, opt
                self.x = x
                self.y = y
                self.n_batches = n_batches

            def fit(self, epochs):
                for epoch in range(epochs):
                    perm = np.random.permutation(len(self.x))
                    for idx in np.array_split(perm, self.n_batches):
                        loss = F.mean_squared_error(self.model(self.x[idx]), self.y[idx])
                        self.model.cleargrads()
                        loss.backward()
                        self.opt.update()


        def main():
            x_train = np.random.rand(40, 2).astype(np.float32)
            y_train = np.random.rand(40, 1).astype(np.float32)
            model = L.Linear(2, 1)
            opt = chainer.optimizers.SGD()
            opt.setup(model)
            Fitter(model, opt, x_train, y_train, 4).fit(2)


        main()
        """)
    )
    assert sorted(_scattered(result.output or "")) == ["x_train", "y_train"]
    said = [e.message for e in result.entries if e.step == "hand-loop" and e.severity == "changed"]
    assert any("batches get smaller" in m for m in said)


def test_loop_without_a_data_source_needs_a_person_with_its_line() -> None:
    result = convert(
        script("""\
        def next_batch():
            return np.random.rand(8, 3).astype(np.float32), np.zeros(8, np.int32)


        model = L.Classifier(L.Linear(3, 2))
        optimizer = chainer.optimizers.SGD()
        optimizer.setup(model)
        for step in range(100):
            x, t = next_batch()
            optimizer.update(model, x, t)
        """)
    )
    needs = [e for e in result.entries if e.step == "hand-loop" and e.severity == "needs-person"]
    assert len(needs) == 1
    assert needs[0].line == len(HEAD.splitlines()) + 8  # the `for step in range(100):` line
    assert _scattered(result.output or "") == []


def test_dict_update_in_a_loop_is_no_training_step() -> None:
    result = convert(
        script("""\
        stats = {}
        for k in range(3):
            stats.update({k: k * 2})
        model = L.Classifier(L.Linear(3, 2))
        optimizer = chainer.optimizers.SGD()
        optimizer.setup(model)
        """)
    )
    assert not [e for e in result.entries if e.step == "hand-loop"]


def test_converted_output_is_a_fixed_point() -> None:
    first = convert(script(PERMUTATION)).output or ""
    again = convert_source(first, "train.py")
    assert again.output == first


def test_example_check_tells_identical_ranks_from_disjoint_shares() -> None:
    """The corpus's data-parallel check (tests/support/examples_seen.py) on made-up counts:
    two epochs of 10 examples in one process; ranks with the same examples, with disjoint
    halves, with one evening repeat, and with a lost example."""
    from collections import Counter

    from tests.support.examples_seen import check_shares

    single = Counter({f"e{i}": 2 for i in range(10)} | {"noise": 1})
    half = [Counter({f"e{i}": 2 for i in range(0, 5)}), Counter({f"e{i}": 2 for i in range(5, 10)})]
    assert check_shares(single, half) == []
    same = [Counter(single), Counter(single)]
    assert "both trained on 10 of the 10" in check_shares(single, same)[0]
    evened = [half[0] + Counter({"e5": 2}), half[1]]
    assert check_shares(single, evened) == []  # size - 1 = 1 repeat is allowed
    lost = [half[0], Counter({f"e{i}": 2 for i in range(5, 9)})]
    assert check_shares(single, lost) == ["1 of the 10 training examples reached no rank"]


def test_example_fingerprint_ignores_the_padding_a_batch_gives_a_sentence() -> None:
    """A sentence padded with -1 to its batch's longest sentence is the same example in any
    batch (the corpus's loop_sentence_lists lost examples to this when batches were reshuffled);
    its content, and float rows, still tell examples apart."""
    import numpy as np

    from tests.support.examples_seen import _rows_of

    short = np.array([[3, 4, -1, -1], [5, 6, 7, -1]], dtype=np.int32)
    long = np.array([[3, 4, -1, -1, -1, -1], [5, 6, 7, 8, 9, 1]], dtype=np.int32)
    assert _rows_of(short)[0] == _rows_of(long)[0]
    assert _rows_of(short)[1] != _rows_of(long)[1]
    floats = np.array([[1.0, -1.0], [1.0, -1.0 + 1e-6]], dtype=np.float32)
    assert len(set(_rows_of(floats) or [])) == 2


EPOCH_HELPER = """\
import numpy as np


def train_epoch(model, optimizer, xs, ys, batchsize):
    N = len(xs)
    perm = np.random.permutation(N)
    for i in range(0, N, batchsize):
        optimizer.update(model, xs[perm[i:i + batchsize]], ys[perm[i:i + batchsize]])
"""


def _convert_project(entry_body: str) -> list[FileResult]:
    from mnify.converter import convert_sources

    sources = {
        "proj/loop.py": EPOCH_HELPER,
        "proj/train.py": HEAD + "import loop\n" + textwrap.dedent(entry_body),
    }
    results = convert_sources(sources)
    for r in results:
        assert r.error is None, r.error
    return results


def test_a_loop_in_another_files_function_is_split_where_the_entry_point_calls_it() -> None:
    """``loop.train_epoch(model, opt, x_train, y_train, b)`` called every epoch: the arrays are
    scattered once, before the epoch loop, in the entry point (the helper's file is unchanged)."""
    helper, entry = _convert_project(
        """\
        x_train = np.random.rand(100, 4).astype(np.float32)
        y_train = (x_train[:, 0] > 0.5).astype(np.int32)
        model = L.Classifier(L.Linear(4, 2))
        optimizer = chainer.optimizers.SGD()
        optimizer.setup(model)
        for epoch in range(3):
            loop.train_epoch(model, optimizer, x_train, y_train, 10)
        """
    )
    assert helper.output == helper.source
    assert not [e for e in helper.entries if e.severity == "needs-person"]
    output = entry.output or ""
    assert _scattered(output) == ["x_train", "y_train"]
    stmts = _module_statements(output)
    loop_at = next(i for i, s in enumerate(stmts) if s.startswith("for epoch"))
    assert stmts[loop_at - 2 : loop_at] == [
        "x_train = mn.scatter_dataset(x_train, comm, shuffle=True, seed=0)",
        "y_train = mn.scatter_dataset(y_train, comm, shuffle=True, seed=0)",
    ]


def test_a_call_handing_over_an_expression_leaves_the_loop_to_a_person() -> None:
    helper, entry = _convert_project(
        """\
        x_train = np.random.rand(100, 4).astype(np.float32)
        y_train = (x_train[:, 0] > 0.5).astype(np.int32)
        model = L.Classifier(L.Linear(4, 2))
        optimizer = chainer.optimizers.SGD()
        optimizer.setup(model)
        loop.train_epoch(model, optimizer, x_train[:80], y_train[:80], 10)
        """
    )
    assert _scattered(entry.output or "") == []
    needs = [e for e in helper.entries if e.severity == "needs-person" and e.step == "hand-loop"]
    assert [e.line for e in needs] == [7]  # the helper's `for i in range(...)` line
