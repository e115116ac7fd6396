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


# ---------------------------------------------------------------- issue 31, item 3: data flow
def _for_iter_calls(output: str, callee: str) -> list[str]:
    """The arguments of the ``callee(...)`` calls the output's ``for`` headers iterate."""
    found = []
    for node in ast.walk(ast.parse(output)):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call):
            if ast.unparse(node.iter.func) == callee:
                found.extend(ast.unparse(a) for a in node.iter.args)
    return found


def test_comprehension_over_array_split_chunks_scatters_what_is_split() -> None:
    """``[train_step(...) for xb, yb in zip(np.array_split(x, k), np.array_split(y, k))]``:
    the step function updates once per call, the comprehension is the loop, x and y are the
    data the chunks are cut from."""
    result = convert(
        script("""\
        def train_step(model, opt, xb, yb):
            loss = F.softmax_cross_entropy(model(xb), yb)
            model.cleargrads()
            loss.backward()
            opt.update()
            return float(loss.array)


        def main():
            x = np.random.rand(400, 5).astype(np.float32)
            y = (x.sum(axis=1) > 2.5).astype(np.int32)
            model = L.Linear(5, 2)
            opt = chainer.optimizers.SGD(lr=0.05)
            opt.setup(model)
            for epoch in range(2):
                losses = [train_step(model, opt, xb, yb)
                          for xb, yb in zip(np.array_split(x, 8), np.array_split(y, 8))]
                print(epoch, sum(losses) / len(losses))


        main()
        """)
    )
    assert _scattered(result.output or "") == ["x", "y"]
    assert not [e for e in result.entries if e.severity == "needs-person"]


def test_training_step_method_in_a_comprehension_splits_the_indexed_arrays() -> None:
    """A class keeps the optimizer it builds in ``__init__`` and steps it in ``step``; the entry
    point calls ``runner.step(x_tr[b], t_tr[b])`` for ``b`` in ``np.array_split(idx, n)``: the
    optimizer is wrapped in ``__init__`` with main()'s communicator, x_tr and t_tr are scattered
    (idx is positions made from the share's length, not data)."""
    result = convert(
        script("""\
        class Runner:
            def __init__(self, model, lr):
                self.model = model
                self.opt = chainer.optimizers.SGD(lr=lr)
                self.opt.setup(model)

            def step(self, x, t):
                loss = F.softmax_cross_entropy(self.model(x), t)
                self.model.cleargrads()
                loss.backward()
                self.opt.update()
                return float(loss.array)


        def main():
            x = np.random.rand(500, 20).astype(np.float32)
            t = np.random.randint(0, 4, 500).astype(np.int32)
            x_tr, t_tr = x[:400], t[:400]
            runner = Runner(L.Linear(20, 4), lr=0.1)
            for ep in range(2):
                idx = np.random.permutation(len(x_tr))
                losses = [runner.step(x_tr[b], t_tr[b]) for b in np.array_split(idx, 10)]


        main()
        """)
    )
    output = result.output or ""
    assert _scattered(output) == ["x_tr", "t_tr"]
    runner = next(n for n in ast.parse(output).body if isinstance(n, ast.ClassDef))
    init = next(n for n in runner.body if isinstance(n, ast.FunctionDef))
    assert [ast.unparse(s) for s in init.body[:2]] == [
        "comm = mn.current_communicator()",
        "self.model = model",
    ]
    assert "mn.create_multi_node_optimizer(chainer.optimizers.SGD(lr=lr), comm)" in ast.unparse(
        init
    )
    said = [e.message for e in result.entries if e.step == "hand-loop" and e.severity == "changed"]
    assert any("batches get smaller" in m for m in said)
    assert not [e for e in result.entries if e.severity == "needs-person"]


BATCH_CLASS = """\
class Batches:
    def __init__(self, inputs, labels, size):
        self.inputs = inputs
        self.labels = labels
        self.size = size

    def __iter__(self):
        order = np.random.permutation(len(self.inputs))
        for start in range(0, len(order), self.size):
            pick = order[start:start + self.size]
            yield self.inputs[pick], self.labels[pick]


"""


def test_iterable_class_data_given_as_slices_is_scattered_where_it_is_given() -> None:
    result = convert(
        script(
            BATCH_CLASS
            + """\
        def main():
            data = np.random.rand(1000, 6).astype(np.float32)
            labels = (data[:, 0] > 0.5).astype(np.int32)
            model = L.Classifier(L.Linear(6, 2))
            optimizer = chainer.optimizers.Adam()
            optimizer.setup(model)
            for epoch in range(2):
                for xb, yb in Batches(data[:800], labels[:800], 50):
                    optimizer.update(model, xb, yb)


        main()
        """
        )
    )
    assert _for_iter_calls(result.output or "", "Batches") == [
        "mn.scatter_dataset(data[:800], comm, shuffle=True, seed=0)",
        "mn.scatter_dataset(labels[:800], comm, shuffle=True, seed=0)",
        "50",
    ]
    assert not [e for e in result.entries if e.severity == "needs-person"]


def test_while_loop_over_next_of_a_batch_object_made_before_it() -> None:
    result = convert(
        script("""\
        class Feeder:
            def __init__(self, xs, ts, batch):
                self.xs, self.ts, self.batch = xs, ts, batch
                self.pos = 0

            def __next__(self):
                if self.pos >= len(self.xs):
                    raise StopIteration
                window = slice(self.pos, self.pos + self.batch)
                self.pos += self.batch
                return self.xs[window], self.ts[window]


        def main():
            xs = np.random.rand(300, 4).astype(np.float32)
            ts = np.zeros(300, np.int32)
            model = L.Classifier(L.Linear(4, 2))
            opt = chainer.optimizers.SGD()
            opt.setup(model)
            feed = Feeder(xs, ts, 30)
            while True:
                try:
                    xb, tb = next(feed)
                except StopIteration:
                    break
                opt.update(model, xb, tb)


        main()
        """)
    )
    assert _scattered(result.output or "") == ["xs", "ts"]


def test_positions_split_into_batches_are_not_data() -> None:
    """``perm`` made before the loop and cut by ``np.array_split``: its pieces index the arrays,
    so the arrays are scattered and the permutation is not."""
    result = convert(
        script("""\
        def step(model, opt, xb, tb):
            opt.update(model, xb, tb)


        def main():
            x = np.random.rand(100, 3).astype(np.float32)
            t = np.zeros(100, np.int32)
            model = L.Classifier(L.Linear(3, 2))
            opt = chainer.optimizers.SGD()
            opt.setup(model)
            perm = np.random.permutation(len(x))
            for b in np.array_split(perm, 5):
                step(model, opt, x[b], t[b])


        main()
        """)
    )
    assert _scattered(result.output or "") == ["x", "t"]


def test_two_loops_over_the_same_arrays_scatter_them_once() -> None:
    result = convert(
        script("""\
        def main():
            x = np.random.rand(300, 4).astype(np.float32)
            t = np.zeros(300, np.int32)
            model = L.Classifier(L.Linear(4, 2))
            opt = chainer.optimizers.SGD()
            opt.setup(model)
            for i in range(0, len(x), 30):
                opt.update(model, x[i:i + 30], t[i:i + 30])
            for epoch in range(2):
                perm = np.random.permutation(len(x))
                for i in range(0, len(x), 30):
                    opt.update(model, x[perm[i:i + 30]], t[perm[i:i + 30]])


        main()
        """)
    )
    assert _scattered(result.output or "") == ["x", "t"]  # once each, not a share of a share


def test_comprehension_step_without_a_data_source_needs_a_person_with_its_line() -> None:
    result = convert(
        script("""\
        def step(model, opt, xb, tb):
            opt.update(model, xb, tb)


        def fetch():
            return np.random.rand(8, 3).astype(np.float32), np.zeros(8, np.int32)


        def main():
            model = L.Classifier(L.Linear(3, 2))
            opt = chainer.optimizers.SGD()
            opt.setup(model)
            losses = [step(model, opt, *fetch()) for _ in range(10)]


        main()
        """)
    )
    needs = [e for e in result.entries if e.step == "hand-loop" and e.severity == "needs-person"]
    assert [e.line for e in needs] == [len(HEAD.splitlines()) + 13]
    assert _scattered(result.output or "") == []
