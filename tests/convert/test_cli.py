"""``mnify convert`` as a user meets it: diff by default, --check, the writing modes, errors."""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mnify.cli import main
from tests.convert.ast_checks import assert_has_statement, assert_no_name
from tests.convert.cases import FIXTURES

MNIST = FIXTURES / "mnist_mlp.in.py"
CONVERTED_MNIST = FIXTURES / "mnist_mlp.out.py"


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["convert", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _diff(path: Path, before: str, after: str) -> str:
    """The unified diff ``mnify convert`` prints for ``path`` converted from ``before``."""
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train_mnist.py"
    path.write_bytes(MNIST.read_bytes())
    return path


def test_default_prints_diff_writes_nothing(script: Path) -> None:
    before = script.read_bytes()
    code, out, err = _run(str(script))
    assert code == 0
    # the diff to the fixture's expected output, with no colour when not on a terminal
    assert out == _diff(script, before.decode("utf-8"), CONVERTED_MNIST.read_text(encoding="utf-8"))
    assert script.read_bytes() == before
    assert list(script.parent.iterdir()) == [script]
    assert "1 changed" in err


def test_check_exits_1_when_it_would_change_and_0_when_converted(
    script: Path, tmp_path: Path
) -> None:
    code, out, err = _run("--check", str(script))
    assert code == 1 and out == "" and f"would convert {script}" in err
    out_file = tmp_path / "converted.py"
    assert _run(str(script), "-o", str(out_file))[0] == 0
    assert _run("--check", str(out_file))[0] == 0


def test_output_file_is_the_conversion(script: Path, tmp_path: Path) -> None:
    out_file = tmp_path / "out.py"
    code, out, _ = _run(str(script), "-o", str(out_file))
    assert code == 0 and out == ""
    assert out_file.read_text(encoding="utf-8") == CONVERTED_MNIST.read_text(encoding="utf-8")


def test_in_place_keeps_a_backup_unless_told(script: Path) -> None:
    original = script.read_text(encoding="utf-8")
    assert _run("--in-place", str(script))[0] == 0
    assert (script.with_name(script.name + ".orig")).read_text(encoding="utf-8") == original
    assert script.read_text(encoding="utf-8") == CONVERTED_MNIST.read_text(encoding="utf-8")
    other = script.with_name("again.py")
    other.write_text(original, encoding="utf-8")
    assert _run("--in-place", "--no-backup", str(other))[0] == 0
    assert not other.with_name("again.py.orig").exists()


def test_outtree_converts_a_project_and_copies_other_files(tmp_path: Path) -> None:
    src = tmp_path / "dcgan"
    src.mkdir()
    for f in (FIXTURES / "dcgan" / "in").glob("*.py"):
        (src / f.name).write_bytes(f.read_bytes())
    (src / "README.txt").write_text("notes\n")
    out = tmp_path / "dcgan_mn"
    code, _, err = _run(str(src), "--outtree", str(out))
    assert code == 0, err
    assert (out / "README.txt").read_text() == "notes\n"
    for name in ("net.py", "train.py", "updater.py"):
        expected = (FIXTURES / "dcgan" / "out" / name).read_text(encoding="utf-8")
        assert (out / name).read_text(encoding="utf-8") == expected, name
    code, _, err = _run(str(src), "--outtree", str(out))
    assert code == 2 and "exists" in err


def test_report_lists_needs_person_first(tmp_path: Path) -> None:
    report = tmp_path / "report.txt"
    code, _, err = _run(str(FIXTURES / "cifar_cnn_bn.in.py"), "--report", str(report))
    assert code == 0
    text = report.read_text()
    assert text.index("## Needs a person") < text.index("## Changed")
    person = text[text.index("## Needs a person") : text.index("## Changed")]
    assert "EarlyStoppingTrigger" in person
    # BatchNormalization is converted where the model is built; loading inside the if/elif
    # that also sets class_labels runs on rank 0 alone: neither needs a person any more
    assert "MN502" not in person and "class_labels" not in person
    assert "needs a person:" in err
    as_json = tmp_path / "report.json"
    assert _run(str(FIXTURES / "cifar_cnn_bn.in.py"), "--report", str(as_json))[0] == 0
    data = json.loads(as_json.read_text())
    assert data["entries"][0]["severity"] == "needs-person"
    assert data["files"][0]["changed"] is True


def test_usage_errors_exit_2(script: Path, tmp_path: Path) -> None:
    assert _run(str(script), str(script), "-o", str(tmp_path / "x.py"))[0] == 2
    assert _run(str(script), "--outtree", str(tmp_path / "t"))[0] == 2
    assert _run(str(script), "--in-place", "-o", str(tmp_path / "x.py"))[0] == 2
    assert _run(str(script), "--target", "horovod")[0] == 2


def test_chainermn_target_and_explicit_communicator(script: Path, tmp_path: Path) -> None:
    converted = tmp_path / "converted.py"
    args = ("--target", "chainermn", "--communicator", "flat")
    code, _, _ = _run(str(script), *args, "-o", str(converted))
    assert code == 0
    text = converted.read_text(encoding="utf-8")
    assert_has_statement(text, "import chainermn")
    assert_has_statement(text, "comm = chainermn.create_communicator('flat')", within="main")
    assert_has_statement(
        text,
        "optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)",
        within="main",
    )
    assert_no_name(text, "mn", "mnify")
    # the diff printed by default is of the same conversion
    code, out, _ = _run(str(script), *args)
    assert code == 0
    assert out == _diff(script, MNIST.read_text(encoding="utf-8"), text)


# --- what a new user might feed it ---------------------------------------------------------

PY2 = 'import chainer\nprint "training on", 1\n'


def test_python2_file_is_an_error_others_continue(script: Path, tmp_path: Path) -> None:
    old = tmp_path / "old_py2.py"
    old.write_text(PY2, encoding="utf-8")
    code, out, err = _run(str(old), str(script))
    assert code == 2
    assert f"error: cannot convert {old}: 2:" in err
    # the good file was still converted
    assert out == _diff(
        script, MNIST.read_text(encoding="utf-8"), CONVERTED_MNIST.read_text(encoding="utf-8")
    )
    assert old.read_text(encoding="utf-8") == PY2


def test_python2_file_in_place_is_left_untouched(tmp_path: Path) -> None:
    old = tmp_path / "old_py2.py"
    old.write_text(PY2, encoding="utf-8")
    assert _run("--in-place", str(old))[0] == 2
    assert old.read_text(encoding="utf-8") == PY2
    assert not old.with_name("old_py2.py.orig").exists()


def test_non_utf8_file_is_an_error_with_its_position(tmp_path: Path) -> None:
    latin = tmp_path / "latin1.py"
    data = "import chainer\n# caf\u00e9\nx = 1\n".encode("latin-1")
    latin.write_bytes(data)
    code, _, err = _run("--in-place", str(latin))
    assert code == 2
    assert f"error: cannot convert {latin}: 2:6: not UTF-8" in err
    assert latin.read_bytes() == data


def test_empty_file_is_fine_and_unchanged(tmp_path: Path) -> None:
    empty = tmp_path / "empty.py"
    empty.write_text("")
    code, out, err = _run(str(empty))
    assert (code, out) == (0, "")
    assert "1 unchanged" in err
    assert _run("--check", str(empty))[0] == 0


def test_file_noqa_skips_the_file(script: Path) -> None:
    script.write_text("# mnify: noqa\n" + script.read_text(encoding="utf-8"), encoding="utf-8")
    code, out, err = _run("--check", str(script))
    assert (code, out) == (0, "")
    assert "skipped" in err


def test_utf8_bom_and_crlf_survive(tmp_path: Path) -> None:
    path = tmp_path / "crlf.py"
    text = MNIST.read_text(encoding="utf-8").replace("\n", "\r\n")
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert _run("--in-place", "--no-backup", str(path))[0] == 0
    data = path.read_bytes()
    converted = CONVERTED_MNIST.read_text(encoding="utf-8").replace("\n", "\r\n")
    assert data == b"\xef\xbb\xbf" + converted.encode("utf-8")


def test_console_script_entry_point(script: Path) -> None:
    exe = Path(sys.executable).parent / "mnify"
    if not exe.exists():
        pytest.skip("mnify is not installed as a console script in this environment")
    run = subprocess.run(
        [str(exe), "convert", "--check", str(script)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 1, run.stderr


def test_color_on_request(script: Path) -> None:
    code, out, _ = _run("--color", str(script))
    assert code == 0
    assert "\x1b[" in out and "create_communicator" in out


EXAMPLE_MNIST = Path(__file__).resolve().parents[2] / "examples" / "mnist" / "train_mnist.py"


def _after_summary(err: str) -> list[str]:
    lines = err.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("mnify convert: "))
    return lines[at + 1 :]


def test_closing_lines_point_to_verify_weak_scaling(tmp_path: Path) -> None:
    """Weak scaling of examples/mnist: the batch, what happens to epochs, the count of items
    needing a person, and the verify command on the written file; three lines at most."""
    out_file = tmp_path / "train_mnist_mn.py"
    code, _, err = _run(str(EXAMPLE_MNIST), "-o", str(out_file))
    assert code == 0
    people = sum(line.startswith("needs a person: ") for line in err.splitlines())
    assert _after_summary(err) == [
        "batch: args.batchsize per rank, args.batchsize * comm.size global (weak scaling): on N "
        "ranks an epoch takes 1/N of the iterations; nothing here counts iterations",
        f"{people} item(s) need a person (listed above)",
        f"next: mnify run -n 2 --verify {out_file} [ARGS...]",
    ]


def test_closing_lines_strong_scaling_and_iteration_schedules(tmp_path: Path) -> None:
    source = tmp_path / "train.py"
    source.write_text(
        MNIST.read_text().replace("(args.epoch, 'epoch')", "(1000, 'iteration')"),
        encoding="utf-8",
    )
    assert "(1000, 'iteration')" in source.read_text()
    _, _, weak = _run(str(source), "-o", str(tmp_path / "weak.py"))
    assert _after_summary(weak)[0].endswith(
        "; 1 schedule(s) counted in iterations now cover N times the examples (see the report)"
    )
    _, _, strong = _run("--scaling", "strong", str(source), "-o", str(tmp_path / "strong.py"))
    closing = _after_summary(strong)
    assert len(closing) == 3
    assert closing[0] == (
        "batch: args.batchsize global as written, args.batchsize // comm.size per rank "
        "(--scaling strong): epochs and iteration-counted schedules keep their meaning"
    )
    assert closing[2] == f"next: mnify run -n 2 --verify {tmp_path / 'strong.py'} [ARGS...]"
