"""noqa comments, rule selection semantics and [tool.mnify] configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnify.config import ConfigError, ConfigFinder
from mnify.lint import SelectorError, lint_source, select_rules
from mnify.lint.files import lint_paths

HEADER = "import chainermn\nfrom chainer.training import extensions\ncomm = chainermn.create_communicator()\n"


def codes_by_line(source: str, **kwargs: object) -> list[tuple[int, str]]:
    return [(d.line, d.code) for d in lint_source(HEADER + source, "t.py", **kwargs)]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("comment", "suppressed"),
    [
        ("# noqa: MN401", True),
        ("# noqa:MN401,MN201", True),
        ("# NOQA", True),
        ("# noqa: MN4", True),
        ("# noqa: MN301", False),
        ("# noqa: E501", False),
    ],
)
def test_line_noqa(comment: str, suppressed: bool) -> None:
    found = codes_by_line(f"trainer.extend(extensions.LogReport())  {comment}\n")
    assert found == ([] if suppressed else [(4, "MN401")])


def test_noqa_applies_to_its_line_only_and_not_inside_strings() -> None:
    source = (
        "trainer.extend(extensions.LogReport())  # noqa: MN401\n"
        "trainer.extend(extensions.LogReport())\n"
        "x = '# noqa'; trainer.extend(extensions.ProgressBar())\n"
    )
    assert codes_by_line(source) == [(5, "MN401"), (6, "MN401")]


def test_file_level_noqa() -> None:
    source = "trainer.extend(extensions.LogReport())\nsubprocess_like = 1\n"
    assert codes_by_line("# mnify: noqa\n" + source) == []
    partial = "# mnify: noqa: MN2\ntrainer.extend(extensions.DumpGraph('l'))\n"
    assert codes_by_line(partial) == [(5, "MN401")]


def test_selection_semantics() -> None:
    def chosen(**kwargs: object) -> list[str]:
        return [rule.code for rule in select_rules(**kwargs)]  # type: ignore[arg-type]

    default = chosen()
    assert "MN901" not in default and "MN301" in default
    assert "MN901" in chosen(select=["ALL"])
    assert chosen(select=["MN3"]) == ["MN301", "MN302"]
    assert chosen(select=["MN3"], ignore=["MN302"]) == ["MN301"]
    assert chosen(select=["MN301"], ignore=["MN3"]) == ["MN301"]  # the more specific wins
    assert chosen(select=["MN3"], ignore=["MN3"]) == []  # a tie: ignore wins
    assert chosen(select=["mn101,MN102"]) == ["MN101", "MN102"]
    assert chosen(extend_select=["MN901"]) == default + ["MN901"]
    assert chosen(ignore=["ALL"]) == []
    assert chosen(ignore=["MN806"]) == default  # convert's report codes are accepted
    for bad in (["MN999"], ["XX1"], ["MN1x"], ["MN1011"]):
        with pytest.raises(SelectorError):
            chosen(select=bad)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


BAD_SCRIPT = HEADER + "trainer.extend(extensions.LogReport())\nimport os\nos.system('ls')\n"


def test_config_is_found_walking_up_and_per_file_ignores_apply(tmp_path: Path) -> None:
    write(
        tmp_path / "pyproject.toml",
        '[tool.mnify]\nignore = ["MN203"]\n'
        '[tool.mnify.per-file-ignores]\n"legacy/*.py" = ["MN401"]\n"special.py" = ["MN4"]\n',
    )
    write(tmp_path / "pkg" / "pyproject.toml", "[project]\nname = 'no-mnify-table'\n")
    plain = write(tmp_path / "pkg" / "train.py", BAD_SCRIPT)
    legacy = write(tmp_path / "legacy" / "old.py", BAD_SCRIPT)
    special = write(tmp_path / "deep" / "special.py", BAD_SCRIPT)
    result = lint_paths([plain, legacy, special])
    assert result.errors == []
    by_file = {(Path(d.path).name, d.code) for d in result.diagnostics}
    assert by_file == {("train.py", "MN401")}
    # the command line extends the config's ignores and can override its selection
    assert lint_paths([plain], ignore=["MN401"]).diagnostics == []
    assert {d.code for d in lint_paths([plain], select=["MN203"]).diagnostics} == {"MN203"}


def test_config_select_and_extend_select(tmp_path: Path) -> None:
    write(
        tmp_path / "pyproject.toml", '[tool.mnify]\nselect = ["MN2"]\nextend_select = ["MN401"]\n'
    )
    script = write(tmp_path / "train.py", BAD_SCRIPT)
    assert {d.code for d in lint_paths([script]).diagnostics} == {"MN203", "MN401"}


def test_config_exclude_applies_to_directory_walks(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.mnify]\nexclude = ["generated/*"]\n')
    write(tmp_path / "generated" / "a.py", BAD_SCRIPT)
    write(tmp_path / ".hidden" / "b.py", BAD_SCRIPT)
    write(tmp_path / ".venv" / "c.py", BAD_SCRIPT)
    write(tmp_path / "src" / "d.py", BAD_SCRIPT)
    result = lint_paths([tmp_path])
    assert result.files == 1
    assert {Path(d.path).name for d in result.diagnostics} == {"d.py"}


@pytest.mark.parametrize(
    "table",
    ['[tool.mnify]\nselct = ["MN1"]\n', '[tool.mnify]\nselect = "MN1"\n', "[tool.mnify\n"],
)
def test_bad_config_is_an_error(tmp_path: Path, table: str) -> None:
    write(tmp_path / "pyproject.toml", table)
    with pytest.raises(ConfigError):
        ConfigFinder().for_path(write(tmp_path / "t.py", ""))


def test_unknown_selector_in_config_is_an_error(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.mnify]\nselect = ["MN777"]\n')
    with pytest.raises(ConfigError, match="MN777"):
        lint_paths([write(tmp_path / "t.py", BAD_SCRIPT)])
