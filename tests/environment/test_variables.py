"""The one table of ``MNIFY_*`` variables and its parser (mnify/environment.py, docs/environment.md):
each type's accepted spellings, the error naming the variable, MNIFY_LAUNCH's round trip, and
the generated table in docs/environment.md being current."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from mnify import environment
from mnify.cli import main
from mnify.environment import BadValue, LaunchWiring

ROOT = Path(__file__).resolve().parents[2]
# Variables of the test suite, scripts/test.sh and the test bed (testkit), not of the package.
TEST_SUITE_VARIABLES = frozenset(
    {"MNIFY_TESTBED", "MNIFY_TEST_WORKERS", "MNIFY_HYPOTHESIS_PROFILE"}
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), (" yes ", True), ("ON", True), ("true", True), ("0", False), ("off", False),
     ("No", False), ("", False), ("   ", False)],
)  # fmt: skip
def test_a_bool_takes_the_usual_spellings_and_blank_is_the_default(
    raw: str, expected: bool
) -> None:
    assert environment.DEBUG.read({"MNIFY_DEBUG": raw}) is expected
    assert environment.SHARED_MEMORY.read({"MNIFY_SHARED_MEMORY": raw}) is (
        expected or not raw.strip()
    )


def test_a_switch_is_on_off_or_auto() -> None:
    read = environment.SINGLE_COPY.read
    assert [read({"MNIFY_SINGLE_COPY": v}) for v in ("1", "0", "auto", "AUTO", "")] == [
        True, False, None, None, None,
    ]  # fmt: skip
    assert read({}) is None


@pytest.mark.parametrize(
    ("variable", "raw", "expected"),
    [
        (environment.WATCHDOG_TIMEOUT, "2.5", 2.5),
        (environment.WATCHDOG_TIMEOUT, "", None),
        (environment.EXIT_BARRIER, "0", 0.0),
        (environment.EXIT_BARRIER, "", 60.0),
        (environment.VERIFY, "", 0),
        (environment.VERIFY, "5", 5),
        (environment.TIMELINE, " /tmp/tl ", "/tmp/tl"),
        (environment.HOSTNAME, "", None),
    ],
)
def test_numbers_and_paths_parse_and_unset_means_the_default(
    variable: environment.Variable[object], raw: str, expected: object
) -> None:
    assert variable.read({variable.name: raw}) == expected
    assert variable.read({}) == variable.default


@pytest.mark.parametrize(
    ("variable", "raw", "says"),
    [
        (environment.DEBUG, "maybe", "MNIFY_DEBUG must be 1 or 0 (true/false, yes/no, on/off), got 'maybe'"),
        (environment.WATCHDOG_TIMEOUT, "soon", "MNIFY_WATCHDOG_TIMEOUT must be a number of seconds, got 'soon'"),
        (environment.VERIFY, "3.5", "MNIFY_VERIFY must be a whole number, got '3.5'"),
        (environment.OVERLAP, "sometimes", "MNIFY_OVERLAP must be 1, 0 or auto"),
        (environment.LAUNCH, "{not json", "MNIFY_LAUNCH must be a JSON object written by mnify run, got '{not json' (not JSON"),
    ],
)  # fmt: skip
def test_a_bad_value_is_an_error_naming_the_variable(
    variable: environment.Variable[object], raw: str, says: str
) -> None:
    with pytest.raises(BadValue) as caught:
        variable.read({variable.name: raw})
    assert str(caught.value).startswith(says)


def test_a_reader_on_the_way_out_says_a_bad_value_and_keeps_the_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert environment.ABORT_GRACE.read_or_default({"MNIFY_ABORT_GRACE": "later"}) == 1.0
    assert "MNIFY_ABORT_GRACE must be a number of seconds, got 'later'" in capsys.readouterr().err


def test_mnify_run_and_scale_refuse_a_bad_value_before_starting_a_rank(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('never run')\n", encoding="utf-8")
    bad = {"MNIFY_DEBUG": "maybe", "MNIFY_EXIT_BARRIER": "soon", "MNIFY_LAUNCH": "ignored"}
    assert environment.bad_values(bad) == [
        "MNIFY_DEBUG must be 1 or 0 (true/false, yes/no, on/off), got 'maybe'",
        "MNIFY_EXIT_BARRIER must be a number of seconds, got 'soon'",
    ]
    runner = CliRunner()
    for command in (["run", "-n", "2"], ["scale", "-n", "1,2"]):
        result = runner.invoke(main, [*command, str(script)], env={"MNIFY_DEBUG": "maybe"})
        assert result.exit_code == 2, result.output
        assert "error: MNIFY_DEBUG must be 1 or 0" in result.output
        assert "never run" not in result.output


def test_the_launch_wiring_round_trips_and_refuses_what_it_does_not_know() -> None:
    wiring = LaunchWiring(
        rank_state_dir="/tmp/s", rank_state_host="h0", verify_report=True, scale_updates=7,
        timeline_events=64, verify_timeout=2.5,
    )  # fmt: skip
    assert LaunchWiring.from_text(wiring.to_text()) == wiring
    assert LaunchWiring().to_text() == "{}"
    assert environment.LAUNCH.read({"MNIFY_LAUNCH": wiring.to_text()}) == wiring
    for bad in ('{"rank_state": "/x"}', '{"scale_updates": 0}', '{"scale_updates": true}',
                '{"verify_report": 1}', "[1]", '{"timeline_events": 8}',
                '{"timeline_events": 64.0}', '{"verify_timeout": 0.5}',
                '{"verify_timeout": true}'):  # fmt: skip
        with pytest.raises(BadValue, match="^MNIFY_LAUNCH must be"):
            environment.LAUNCH.read({"MNIFY_LAUNCH": bad})


def test_the_timeline_ring_and_the_verify_stop_follow_the_wiring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mnify.runtime import timeline
    from mnify.runtime.verify import session

    monkeypatch.delenv("MNIFY_LAUNCH", raising=False)
    assert timeline.capacity_from_env() == timeline.DEFAULT_EVENTS == 1 << 17
    assert session._timeout() == session.DEFAULT_TIMEOUT
    monkeypatch.setenv("MNIFY_LAUNCH", '{"timeline_events": 64, "verify_timeout": 7}')
    assert timeline.capacity_from_env() == 64
    assert session._timeout() == 7.0
    assert LaunchWiring.from_text('{"verify_timeout": 7}').verify_timeout == 7


def test_values_are_read_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank scripts set a variable in os.environ just before creating a communicator."""
    monkeypatch.delenv("MNIFY_SHARED_MEMORY", raising=False)
    assert environment.SHARED_MEMORY.read() is True
    monkeypatch.setenv("MNIFY_SHARED_MEMORY", "0")
    assert environment.SHARED_MEMORY.read() is False


def test_the_table_has_each_variable_once_with_a_meaning() -> None:
    names = [v.name for v in environment.VARIABLES]
    assert len(names) == len(set(names))
    for v in environment.VARIABLES:
        assert re.fullmatch(r"MNIFY_[A-Z0-9_]+", v.name), v.name
        assert len(v.meaning.split()) >= 8, f"{v.name}: say what it means"
    assert [v.name for v in environment.VARIABLES if v.set_by == "launcher"] == ["MNIFY_LAUNCH"]
    assert set(environment.NOT_FORWARDED) == {"MNIFY_HOSTNAME", "MNIFY_MPIEXEC", "MNIFY_LAUNCH"}


def test_docs_environment_md_is_up_to_date() -> None:
    written = (ROOT / "docs" / "environment.md").read_text(encoding="utf-8")
    assert written == environment.with_current_table(written), (
        "docs/environment.md's table is stale: run `python -m mnify.environment docs/environment.md`"
    )


def test_every_variable_the_docs_and_the_package_name_is_in_the_table() -> None:
    """A variable renamed or folded into MNIFY_LAUNCH leaves no stale mention behind (but in
    docs/environment.md's changelog, which names the old ones)."""
    known = {v.name for v in environment.VARIABLES} | TEST_SUITE_VARIABLES
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    texts += sorted((ROOT / "mnify").rglob("*.py"))
    for path in texts:
        text = path.read_text(encoding="utf-8").partition("\n## Changes\n")[0]
        named = set(re.findall(r"\bMNIFY_[A-Z0-9_]*[A-Z0-9]\b", text))
        assert named <= known, f"{path.relative_to(ROOT)} names {sorted(named - known)}"
