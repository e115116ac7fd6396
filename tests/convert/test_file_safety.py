"""``mnify convert`` never loses or corrupts a user's file, and fails with ``error:`` lines, not
tracebacks (issue 11). Everything runs through the installed console script."""

from __future__ import annotations

import os
import random
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mnify.sourcefile import SourceEncodeError, decode_source
from tests.convert.cases import FIXTURES

MNIST = FIXTURES / "mnist_mlp.in.py"
ORIGINAL = MNIST.read_bytes()
CONVERTED = (FIXTURES / "mnist_mlp.out.py").read_bytes()
MNIFY = Path(sys.executable).parent / "mnify"
SUMMARY = "mnify convert: "


def mnify(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if not MNIFY.exists():
        pytest.skip("mnify is not installed as a console script next to this Python")
    return subprocess.run(
        [str(MNIFY), "convert", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def error_lines(run: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in run.stderr.splitlines() if line.startswith("error:")]


def assert_clean_failure(run: subprocess.CompletedProcess[str]) -> None:
    """Exit 2 with error lines and the summary, and no traceback."""
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert error_lines(run), run.stderr
    assert run.stderr.splitlines()[-1].startswith(SUMMARY), run.stderr


def temp_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.name.endswith(".mnify-tmp"))


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_bytes(ORIGINAL)
    return path


# --- never write over the input -------------------------------------------------------------


def test_output_that_is_the_input_is_refused_under_any_name(script: Path, tmp_path: Path) -> None:
    (tmp_path / "link.py").symlink_to("train.py")
    os.link(script, tmp_path / "hard.py")
    (tmp_path / "sub").mkdir()
    listing = names(tmp_path)
    for output in ("train.py", "link.py", "hard.py", "sub/../train.py", str(script)):
        run = mnify("train.py", "-o", output, cwd=tmp_path)
        assert run.returncode == 2, (output, run.stderr)
        assert "is the input file" in run.stderr, output
        assert script.read_bytes() == ORIGINAL
        assert names(tmp_path) == listing


def test_outtree_inside_or_around_the_input_is_refused(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_bytes(ORIGINAL)
    for outtree, why in (
        ("project/converted", "inside"),
        ("project", "inside"),
        (".", "contains"),
        (str(tmp_path.parent), "contains"),
    ):
        run = mnify("project", "--outtree", outtree, cwd=tmp_path)
        assert run.returncode == 2, (outtree, run.stderr)
        assert why in run.stderr, outtree
        assert names(project) == ["train.py"]
        assert (project / "train.py").read_bytes() == ORIGINAL


# --- --in-place ---------------------------------------------------------------------------------


def test_in_place_keeps_the_mode(script: Path, tmp_path: Path) -> None:
    script.chmod(0o755)
    run = mnify("--in-place", "train.py", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert script.read_bytes() == CONVERTED
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    assert (tmp_path / "train.py.orig").read_bytes() == ORIGINAL


def test_in_place_through_a_symlink_rewrites_the_target(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "train.py").write_bytes(ORIGINAL)
    link = tmp_path / "train.py"
    link.symlink_to("real/train.py")
    run = mnify("--in-place", "train.py", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert link.is_symlink() and os.readlink(link) == "real/train.py"
    assert (real / "train.py").read_bytes() == CONVERTED
    assert (real / "train.py.orig").read_bytes() == ORIGINAL
    assert names(tmp_path) == ["real", "train.py"]
    assert names(real) == ["train.py", "train.py.orig"]


def test_a_file_that_would_not_change_is_neither_written_nor_backed_up(tmp_path: Path) -> None:
    done = tmp_path / "train.py"
    done.write_bytes(CONVERTED)
    before = done.stat()
    run = mnify("--in-place", "train.py", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    after = done.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert names(tmp_path) == ["train.py"]


def test_an_existing_backup_refuses_that_file_and_the_others_continue(tmp_path: Path) -> None:
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_bytes(ORIGINAL)
    (tmp_path / "a.py.orig").write_bytes(b"an older backup\n")
    run = mnify("--in-place", "a.py", "b.py", cwd=tmp_path)
    assert_clean_failure(run)
    assert [line.split(":")[1].strip() for line in error_lines(run)] == ["a.py"]
    assert (tmp_path / "a.py").read_bytes() == ORIGINAL
    assert (tmp_path / "a.py.orig").read_bytes() == b"an older backup\n"
    assert (tmp_path / "b.py").read_bytes() == CONVERTED
    assert (tmp_path / "b.py.orig").read_bytes() == ORIGINAL
    assert "1 changed" in run.stderr.splitlines()[-1] and "1 failed" in run.stderr


def test_a_killed_runs_backup_of_the_same_bytes_does_not_block_the_next_run(
    script: Path, tmp_path: Path
) -> None:
    """A run killed after making the backup and before replacing the file leaves SRC.orig
    holding exactly the file's bytes: the next run keeps that backup and converts."""
    (tmp_path / "train.py.orig").write_bytes(ORIGINAL)
    run = mnify("--in-place", "train.py", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert script.read_bytes() == CONVERTED
    assert (tmp_path / "train.py.orig").read_bytes() == ORIGINAL
    assert names(tmp_path) == ["train.py", "train.py.orig"]


def test_stale_temporary_files_of_a_killed_run_are_ignored_and_removed(
    script: Path, tmp_path: Path
) -> None:
    """SIGKILL can leave ``.train.py.XXXX.mnify-tmp`` (maybe partial): a directory conversion
    never takes it for a script, and the next write beside it removes it once it is stale;
    a fresh one (a run writing right now) is left alone."""
    stale = tmp_path / ".train.py.k1ll3d.mnify-tmp"
    stale.write_bytes(ORIGINAL[:10])
    old = time.time() - 3600
    os.utime(stale, (old, old))
    fresh = tmp_path / ".train.py.l1v3.mnify-tmp"
    fresh.write_bytes(ORIGINAL[:5])
    run = mnify("--in-place", str(tmp_path), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert script.read_bytes() == CONVERTED
    assert names(tmp_path) == [".train.py.l1v3.mnify-tmp", "train.py", "train.py.orig"]


def test_a_rerun_after_editing_never_overwrites_the_backup(script: Path, tmp_path: Path) -> None:
    assert mnify("--in-place", "train.py", cwd=tmp_path).returncode == 0
    edited = ORIGINAL + b"# edited after the first run\n"
    script.write_bytes(edited)  # say, the single-GPU version restored and changed
    run = mnify("--in-place", "train.py", cwd=tmp_path)
    assert_clean_failure(run)
    assert script.read_bytes() == edited
    assert (tmp_path / "train.py.orig").read_bytes() == ORIGINAL
    assert names(tmp_path) == ["train.py", "train.py.orig"]


def test_two_concurrent_in_place_runs_leave_one_backup_of_the_original(tmp_path: Path) -> None:
    if not MNIFY.exists():
        pytest.skip("mnify is not installed as a console script next to this Python")
    for round_ in range(4):
        where = tmp_path / f"round{round_}"
        where.mkdir()
        (where / "train.py").write_bytes(ORIGINAL)
        runs = [
            subprocess.Popen(
                [str(MNIFY), "convert", "--in-place", "train.py"],
                cwd=where,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outcomes = [(run.wait(timeout=120), run.communicate()[1]) for run in runs]
        assert (where / "train.py").read_bytes() == CONVERTED
        assert (where / "train.py.orig").read_bytes() == ORIGINAL
        assert names(where) == ["train.py", "train.py.orig"]
        codes = sorted(code for code, _ in outcomes)
        # The second either found the file converted already (nothing to do), or took the
        # first one's backup of the same bytes as its own and then found the file replaced
        # under it and refused.
        assert codes in ([0, 0], [0, 2]), outcomes
        for code, err in outcomes:
            if code == 2:
                assert [line for line in err.splitlines() if line.startswith("error:")] == [
                    "error: train.py: changed on disk while it was being converted; not written"
                ]


def _kill_at_random(
    run: subprocess.Popen[bytes], where: Path, rng: random.Random, span: float
) -> None:
    """SIGKILL ``run`` at a random moment: anywhere in a run of ``span`` seconds, or (every
    other time) a few milliseconds after it starts writing files into ``where``."""
    if rng.random() < 0.5:
        try:
            run.wait(timeout=rng.uniform(0.2, 1.1) * span)
        except subprocess.TimeoutExpired:
            pass
    else:
        while run.poll() is None and names(where) == ["train.py"]:
            time.sleep(0.0005)
        time.sleep(rng.uniform(0.0, 0.004))
    if run.poll() is None:
        os.kill(run.pid, signal.SIGKILL)
    run.wait()


@pytest.mark.slow
def test_kill_9_never_truncates_the_input_or_the_backup(tmp_path: Path) -> None:
    if not MNIFY.exists():
        pytest.skip("mnify is not installed as a console script next to this Python")
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    probe = tmp_path / "probe"  # one undisturbed run, to spread the kills over a whole run
    probe.mkdir()
    (probe / "train.py").write_bytes(ORIGINAL)
    began = time.monotonic()
    subprocess.run([str(MNIFY), "convert", "--in-place", "train.py"], cwd=probe, check=True)
    span = time.monotonic() - began
    for attempt in range(12):
        where = tmp_path / f"copy{attempt}"
        where.mkdir()
        (where / "train.py").write_bytes(ORIGINAL)
        run = subprocess.Popen(
            [str(MNIFY), "convert", "--in-place", "train.py"],
            cwd=where,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _kill_at_random(run, where, rng, span)
        context = f"seed {seed}, copy {attempt}: {names(where)}"
        now = (where / "train.py").read_bytes()
        assert now in (ORIGINAL, CONVERTED), context
        backup = where / "train.py.orig"
        if backup.exists():
            assert backup.read_bytes() == ORIGINAL, context
        if now == CONVERTED:
            assert backup.exists(), context  # the backup is made before the file is replaced
        # A killed run may leave its hidden temporary files, never anything else.
        leftovers = {n for n in names(where) if not n.endswith(".mnify-tmp")}
        assert leftovers <= {"train.py", "train.py.orig"}, context


# --- encodings, BOM, line endings ---------------------------------------------------------------

ENCODED_LINES = {
    "latin-1": ("# Entraînement du réseau, café compris", "DESCRIPTION = 'résumé'"),
    "shift_jis": ("# 学習用スクリプト（日本語のコメント）", "DESCRIPTION = '手書き数字の分類'"),
    "euc-jp": ("# 学習用スクリプト（日本語のコメント）", "DESCRIPTION = '手書き数字の分類'"),
}


def _with_cookie(cookie: str, comment: str, assignment: str) -> str:
    text = ORIGINAL.decode("utf-8")
    header, rest = text.split("\n", 1)  # keep the #! line first
    rest = rest.replace("import argparse\n", f"import argparse\n{comment}\n{assignment}\n", 1)
    return f"{header}\n# -*- coding: {cookie} -*-\n{rest}"


@pytest.mark.parametrize("encoding", sorted(ENCODED_LINES))
def test_coding_cookie_files_are_converted_in_their_own_encoding(
    tmp_path: Path, encoding: str
) -> None:
    comment, assignment = ENCODED_LINES[encoding]
    original = _with_cookie(encoding, comment, assignment).encode(encoding)
    (tmp_path / "train.py").write_bytes(original)
    # The same script in UTF-8, converted, is what the encoded file must become byte for byte.
    reference = tmp_path / "reference.py"
    reference.write_text(_with_cookie("utf-8", comment, assignment), encoding="utf-8")
    assert mnify("reference.py", "-o", "reference_out.py", cwd=tmp_path).returncode == 0
    expected_text = (tmp_path / "reference_out.py").read_text(encoding="utf-8")
    expected = expected_text.replace("coding: utf-8", f"coding: {encoding}", 1).encode(encoding)
    run = mnify("--in-place", "train.py", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    converted = (tmp_path / "train.py").read_bytes()
    assert converted == expected
    assert converted != original
    assert f"\n{comment}\n{assignment}\n".encode(encoding) in converted
    assert (tmp_path / "train.py.orig").read_bytes() == original


def test_a_cookie_file_cannot_be_given_a_character_its_encoding_lacks() -> None:
    source = decode_source("# -*- coding: latin-1 -*-\nx = 'é'\n".encode("latin-1"))
    assert source.encode(source.text + "y = 'ok'\n").endswith(b"y = 'ok'\n")
    with pytest.raises(SourceEncodeError) as raised:
        source.encode(source.text + "y = '学'\n")
    assert (raised.value.line, raised.value.col) == (3, 6)


def test_bom_and_crlf_are_kept(tmp_path: Path) -> None:
    crlf = tmp_path / "train.py"
    original = b"\xef\xbb\xbf" + ORIGINAL.replace(b"\n", b"\r\n")
    crlf.write_bytes(original)
    run = mnify("--in-place", "train.py", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert crlf.read_bytes() == b"\xef\xbb\xbf" + CONVERTED.replace(b"\n", b"\r\n")
    assert (tmp_path / "train.py.orig").read_bytes() == original


# --- trees with odd links -----------------------------------------------------------------------


@pytest.fixture
def tangled(tmp_path: Path) -> Path:
    """A project with a dangling ``*.py`` link, a ``*.py`` link loop and a directory loop."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_bytes(ORIGINAL)
    (project / "notes.txt").write_text("keep me\n")
    (project / "dangling.py").symlink_to("missing.py")
    (project / "loop.py").symlink_to("loop.py")
    (project / "again").symlink_to("..")
    return project


def test_outtree_reports_dangling_links_and_loops_and_copies_the_rest(
    tangled: Path, tmp_path: Path
) -> None:
    run = mnify("project", "--outtree", "out", cwd=tmp_path)
    assert_clean_failure(run)
    assert error_lines(run) == [
        "error: project/dangling.py: dangling symbolic link (to missing.py)",
        "error: project/loop.py: symbolic link loop",
    ]
    out = tmp_path / "out"
    assert names(out) == ["again", "dangling.py", "loop.py", "notes.txt", "train.py"]
    assert (out / "train.py").read_bytes() == CONVERTED
    assert (out / "notes.txt").read_text() == "keep me\n"
    assert os.readlink(out / "again") == ".."  # copied as a link, not followed
    assert "1 changed" in run.stderr and "2 failed" in run.stderr


def test_in_place_over_a_tangled_tree_converts_what_it_can(tangled: Path, tmp_path: Path) -> None:
    run = mnify("--in-place", "project", cwd=tmp_path)
    assert_clean_failure(run)
    assert len(error_lines(run)) == 2
    assert (tangled / "train.py").read_bytes() == CONVERTED
    assert (tangled / "train.py.orig").read_bytes() == ORIGINAL
    assert os.readlink(tangled / "dangling.py") == "missing.py"
    assert not (tmp_path / "missing.py").exists()


# --- output locations that cannot be written ------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("-o", "missing/train_mn.py"),
        ("-o", "notes.txt/train_mn.py"),
        ("--report", "missing/report.txt"),
        ("--report", "notes.txt/report.json"),
        ("--outtree", "notes.txt/out"),
    ],
)
def test_unwritable_output_is_an_error_line(tmp_path: Path, args: tuple[str, str]) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_bytes(ORIGINAL)
    (tmp_path / "notes.txt").write_text("a file, not a directory\n")
    source = "project" if args[0] == "--outtree" else "project/train.py"
    run = mnify(source, *args, cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    where = args[1] if args[0] != "--outtree" else "notes.txt/out"
    assert error_lines(run)[0].startswith(f"error: {where}: "), run.stderr
    assert any(line.startswith(SUMMARY) for line in run.stderr.splitlines())
    assert names(tmp_path) == ["notes.txt", "project"]
    assert names(project) == ["train.py"] and (project / "train.py").read_bytes() == ORIGINAL


@pytest.fixture
def freeze() -> Iterator[Callable[[Path], None]]:
    """Make a path impossible to replace or write into, even for root (``chattr +i``); without
    chattr, a read-only directory, which stops everyone but root."""
    frozen: list[Path] = []
    modes: list[tuple[Path, int]] = []

    def apply(path: Path) -> None:
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
        if done.returncode == 0:
            frozen.append(path)
            return
        if os.geteuid() == 0:
            pytest.skip("running as root and chattr +i does not work here: root ignores modes")
        directory = path if path.is_dir() else path.parent
        modes.append((directory, stat.S_IMODE(directory.stat().st_mode)))
        directory.chmod(0o555)

    try:
        yield apply
    finally:
        for path in frozen:
            subprocess.run(["chattr", "-i", str(path)], check=False)
        for directory, mode in modes:
            directory.chmod(mode)


def test_in_place_on_a_file_that_cannot_be_replaced(
    tmp_path: Path, freeze: Callable[[Path], None]
) -> None:
    project = tmp_path / "project"
    locked = project / "locked"
    locked.mkdir(parents=True)
    (locked / "a.py").write_bytes(ORIGINAL)
    (project / "b.py").write_bytes(ORIGINAL)
    freeze(locked / "a.py")
    run = mnify("--in-place", "project", cwd=tmp_path)
    assert_clean_failure(run)
    assert [line.split(":")[1].strip() for line in error_lines(run)] == ["project/locked/a.py"]
    assert (locked / "a.py").read_bytes() == ORIGINAL
    assert names(locked) == ["a.py"]  # no backup, no temporary file
    assert (project / "b.py").read_bytes() == CONVERTED
    assert (project / "b.py.orig").read_bytes() == ORIGINAL
    assert "1 changed" in run.stderr.splitlines()[-1] and "1 failed" in run.stderr
    assert temp_files(tmp_path) == []


def test_output_into_a_read_only_directory(
    script: Path, tmp_path: Path, freeze: Callable[[Path], None]
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    freeze(locked)
    for args in (("-o", "locked/train_mn.py"), ("--report", "locked/report.txt")):
        run = mnify("train.py", *args, cwd=tmp_path)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        assert error_lines(run)[0].startswith(f"error: {args[1]}: ")
        assert any(line.startswith(SUMMARY) for line in run.stderr.splitlines())
        assert names(locked) == []
    assert temp_files(tmp_path) == []
