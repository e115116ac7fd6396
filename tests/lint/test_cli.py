"""``mnify lint/explain/rules`` through click's CliRunner, and once through the real console
script."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mnify.cli import main
from mnify.lint import ALL_RULES
from mnify.lint.docs import render_markdown

DISTRIBUTED = """\
import chainermn
from chainer.training import extensions

comm = chainermn.create_communicator()
trainer.extend(extensions.LogReport())
if comm.rank == 0:
    comm.barrier()
"""
CLEAN = "import chainer\n\nmodel = chainer.links.Linear(3)\n"
FORKING = "import os\nimport chainer\n\n\nos.system('ls')\n"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "b_train.py").write_text(DISTRIBUTED, encoding="utf-8")
    (tmp_path / "a_tool.py").write_text(FORKING, encoding="utf-8")
    (tmp_path / "clean.py").write_text(CLEAN, encoding="utf-8")
    return tmp_path


def test_concise_output_is_sorted_by_path_line_column(project: Path) -> None:
    code, out, err = invoke("lint", str(project / "b_train.py"), str(project))
    assert code == 1 and err == ""
    lines = out.splitlines()
    a, b = (project / "a_tool.py").as_posix(), (project / "b_train.py").as_posix()
    assert lines[:-1] == [
        f"{a}:5:1: MN203 `os.system` forks the MPI process",
        f"{b}:5:16: MN401 `LogReport` registered on every rank; "
        "register it under `if comm.rank == 0:`",
        f"{b}:7:5: MN301 `barrier` runs only on the ranks that take the rank check at line 6; "
        "the other ranks never join it (deadlock)",
    ]
    assert lines[-1] == "Found 3 findings (1 fixable with `mnify lint --fix`)."  # b_train.py once


def test_exit_codes(project: Path) -> None:
    assert invoke("lint", str(project / "clean.py"))[:2] == (0, "All checks passed!\n")
    assert invoke("lint", str(project / "a_tool.py"))[0] == 1
    assert invoke("lint", "--exit-zero", str(project / "a_tool.py"))[0] == 0
    assert invoke("lint", "--ignore", "MN2", str(project / "a_tool.py"))[0] == 0
    code, _, err = invoke("lint", "--select", "MN77", str(project))
    assert code == 2 and "MN77" in err
    code, _, err = invoke("lint", str(project / "missing.py"))
    assert code == 2 and "missing.py" in err


def test_unparsable_file_is_an_error_and_the_others_are_still_linted(project: Path) -> None:
    (project / "py2.py").write_text("import chainer\nprint 'hello'\n", encoding="utf-8")
    code, out, err = invoke("lint", str(project))
    assert code == 2
    py2 = (project / "py2.py").as_posix()
    assert err.splitlines() == [
        f"error: cannot lint {py2}: 2:1: Missing parentheses in call to 'print'. "
        "Did you mean print(...)?"
    ]
    assert "MN203" in out and "MN301" in out


def test_select_ignore_extend_select(project: Path) -> None:
    def codes(*options: str) -> set[str]:
        out = invoke("lint", "--output-format", "json", *options, str(project))[1]
        return {item["code"] for item in json.loads(out)}

    assert codes() == {"MN203", "MN301", "MN401"}
    assert codes("--select", "MN3,MN4") == {"MN301", "MN401"}
    assert codes("--select", "ALL", "--ignore", "MN4", "--ignore", "MN203") == {"MN301"}
    assert codes("--select", "MN301", "--extend-select", "MN203") == {"MN203", "MN301"}


def _positions_concise(text: str) -> list[tuple[str, int, int, str]]:
    found = []
    for line in text.splitlines():
        match = re.match(r"^(.*):(\d+):(\d+): (MN\d+) ", line)
        if match:
            found.append((match[1], int(match[2]), int(match[3]), match[4]))
    return found


def _positions_github(text: str) -> list[tuple[str, int, int, str]]:
    found = []
    for line in text.splitlines():
        match = re.match(
            r"^::error file=(.*?),line=(\d+),col=(\d+),.*title=mnify \((MN\d+)\)::", line
        )
        assert match, line
        found.append((match[1], int(match[2]), int(match[3]), match[4]))
    return found


def test_columns_are_identical_in_every_output_format(project: Path) -> None:
    outputs = {
        fmt: invoke("lint", "--output-format", fmt, str(project))[1]
        for fmt in ("concise", "json", "github", "sarif")
    }
    concise = _positions_concise(outputs["concise"])
    as_json = [(d["path"], d["line"], d["column"], d["code"]) for d in json.loads(outputs["json"])]
    sarif = json.loads(outputs["sarif"])["runs"][0]["results"]
    as_sarif = [
        (
            r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
            r["locations"][0]["physicalLocation"]["region"]["startLine"],
            r["locations"][0]["physicalLocation"]["region"]["startColumn"],
            r["ruleId"],
        )
        for r in sarif
    ]
    assert len(concise) == 3
    assert concise == as_json == _positions_github(outputs["github"]) == as_sarif


def test_json_fields(project: Path) -> None:
    out = invoke("lint", "--output-format", "json", str(project / "b_train.py"))[1]
    first = json.loads(out)[0]
    assert set(first) == {
        "code",
        "message",
        "path",
        "line",
        "column",
        "end_line",
        "end_column",
        "fixable",
    }
    assert (first["code"], first["line"], first["column"]) == ("MN401", 5, 16)
    assert (first["end_line"], first["end_column"], first["fixable"]) == (5, 38, True)


def test_sarif_is_a_well_formed_2_1_0_log(project: Path) -> None:
    log = json.loads(invoke("lint", "--output-format", "sarif", str(project))[1])
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "mnify"
    assert [rule["id"] for rule in driver["rules"]] == [rule.code for rule in ALL_RULES]
    for rule in driver["rules"]:
        assert rule["shortDescription"]["text"] and rule["fullDescription"]["text"]
    assert run["results"]
    for result in run["results"]:
        assert driver["rules"][result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["level"] in ("none", "note", "warning", "error")
        assert result["message"]["text"]
        region = result["locations"][0]["physicalLocation"]["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1
        assert (region["endLine"], region["endColumn"]) >= (
            region["startLine"],
            region["startColumn"],
        )


def test_github_escapes_workflow_command_characters(tmp_path: Path) -> None:
    weird = tmp_path / "a,b:c.py"
    weird.write_text(FORKING, encoding="utf-8")
    out = invoke("lint", "--output-format", "github", str(weird))[1]
    assert "file=" + weird.as_posix().replace(":", "%3A").replace(",", "%2C") + "," in out


def test_statistics_most_frequent_first(project: Path) -> None:
    (project / "c_train.py").write_text(DISTRIBUTED, encoding="utf-8")
    code, out, _ = invoke("lint", "--statistics", str(project))
    assert code == 1
    assert out.splitlines() == [
        "    2\tMN301\t    collective-on-some-ranks",
        "    2\tMN401\t[*] reporting-extension-on-every-rank",
        "    1\tMN203\t    subprocess-under-mpi",
    ]


def test_config_from_pyproject_applies(project: Path) -> None:
    (project / "pyproject.toml").write_text(
        '[tool.mnify]\nignore = ["MN4"]\n[tool.mnify.per-file-ignores]\n"a_*.py" = ["MN203"]\n',
        encoding="utf-8",
    )
    out = invoke("lint", "--output-format", "json", str(project))[1]
    assert {d["code"] for d in json.loads(out)} == {"MN301"}


def test_explain() -> None:
    code, out, _ = invoke("explain", "MN301")
    assert code == 0
    assert out.startswith("MN301 (collective-on-some-ranks)")
    for section in ("What:", "Fires when:", "Why:", "Bad:", "Good:", "Fixed by `mnify convert`"):
        assert section in out
    assert "    if comm.rank == 0:\n        comm.barrier()" in out
    assert invoke("explain", "plain-evaluator")[1].startswith("MN505")
    code, _, err = invoke("explain", "MN999")
    assert code == 2 and "MN999" in err


def test_rules_table_and_markdown() -> None:
    code, out, _ = invoke("rules")
    assert code == 0
    for rule in ALL_RULES:
        assert re.search(rf"{rule.code}\s.*{rule.name}", out), rule.code
    assert invoke("rules", "--format", "markdown")[1] == render_markdown(ALL_RULES)
    rows = json.loads(invoke("rules", "--format", "json")[1])
    assert {row["code"]: row["default"] for row in rows}["MN901"] is False


def test_real_console_script(project: Path) -> None:
    script = Path(sys.executable).with_name("mnify")
    if not script.exists():
        pytest.skip("the mnify console script is not installed in this environment")
    run = subprocess.run(
        [str(script), "lint", "--output-format", "concise", str(project / "b_train.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 1, run.stderr
    assert f"{(project / 'b_train.py').as_posix()}:7:5: MN301 " in run.stdout


def test_non_utf8_file_is_an_error_with_position(tmp_path: Path) -> None:
    (tmp_path / "latin1.py").write_bytes(b"import chainer\nname = '\xe9t\xe9'\n")
    code, _, err = invoke("lint", str(tmp_path / "latin1.py"))
    assert code == 2
    assert err.startswith(
        f"error: cannot lint {(tmp_path / 'latin1.py').as_posix()}: 2:9: not UTF-8"
    )


def test_stdin(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["lint", "-", "--stdin-filename", "train.py"], input=DISTRIBUTED.encode()
    )
    assert result.exit_code == 1
    assert result.stdout.splitlines()[0].startswith("train.py:5:16: MN401 ")


@pytest.mark.parametrize("rule", ALL_RULES, ids=[r.code for r in ALL_RULES])
def test_explain_every_rule(rule: type) -> None:
    code, out, _ = invoke("explain", rule.code.lower())
    assert code == 0
    assert out.startswith(f"{rule.code} ({rule.name})")
    assert rule.bad.splitlines()[-1] in out and rule.good.splitlines()[-1] in out


def test_lint_imports_neither_mpi_nor_chainer() -> None:
    probe = (
        "import sys, mnify.cli.lint, mnify.lint\n"
        "print(sorted(m for m in ('mpi4py', 'chainer', 'cupy', 'numpy') if m in sys.modules))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert run.stdout.strip() == "[]"


def test_statistics_as_json(project: Path) -> None:
    out = invoke("lint", "--statistics", "--output-format", "json", str(project))[1]
    rows = json.loads(out)
    assert {row["code"]: row["count"] for row in rows} == {"MN203": 1, "MN301": 1, "MN401": 1}
    assert {row["code"]: row["fixable"] for row in rows}["MN401"] is True
