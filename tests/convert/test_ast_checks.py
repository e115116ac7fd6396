"""The structural checks the converter tests assert with (tests/convert/ast_checks.py): each
matches what it should and, where a substring check would have passed, fails where it must."""

from __future__ import annotations

import ast

import pytest

from tests.convert.ast_checks import (
    assert_has_expression,
    assert_has_statement,
    assert_no_expression,
    assert_no_keyword,
    assert_no_name,
    assert_no_statement,
    contains,
    find_expressions,
    find_statements,
    index_of,
    is_statement,
    names_used,
)

CODE = '''\
import chainermn.links
from mnify import runtime as mn


def main():
    """Train."""
    comm = mn.create_communicator("pure_nccl" if args.gpu else 'flat')
    model = L.Classifier(L.Linear(3, 2))
    model = mn.links.create_mnbn_model(model, comm)
    if comm.rank == 0:
        print('ready')
        print('set')
    evaluator = mn.create_multi_node_evaluator(Evaluator(it, model), comm, gather=True)
    communicator_name = 'flat'
    flag = 1
'''


def test_spacing_quotes_and_line_breaks_do_not_matter() -> None:
    assert_has_statement(
        CODE, "comm = mn.create_communicator('pure_nccl' if args.gpu else \"flat\")"
    )
    assert_has_statement(
        CODE,
        """\
        model = L.Classifier(
            L.Linear(3,  2))
        """,
    )


def test_statements_must_be_consecutive_in_one_block() -> None:
    assert_has_statement(
        CODE,
        "model = L.Classifier(L.Linear(3, 2))\nmodel = mn.links.create_mnbn_model(model, comm)",
    )
    assert not find_statements(
        CODE, "comm = mn.create_communicator(...)\nmodel = mn.links.create_mnbn_model(model, comm)"
    )
    with pytest.raises(AssertionError):
        assert_has_statement(CODE, "print('ready')\nprint('go')")


def test_a_compound_statement_matches_whole_unless_its_block_ends_in_a_wildcard() -> None:
    assert not find_statements(CODE, "if comm.rank == 0:\n    print('ready')")
    assert_has_statement(CODE, "if comm.rank == 0:\n    print('ready')\n    ...")
    assert_has_statement(CODE, "if comm.rank == 0:\n    ...\n    print('set')")
    assert_no_statement(CODE, "if comm.rank == 0:\n    print('set')\n    ...")


def test_an_ellipsis_argument_allows_any_arguments_and_keywords() -> None:
    assert_has_statement(CODE, "comm = mn.create_communicator(...)")
    assert_has_expression(CODE, "mn.create_multi_node_evaluator(..., comm, gather=True)")
    assert_has_expression(CODE, "mn.create_multi_node_evaluator(...)")
    # without one, the keywords must be exactly those named
    assert_no_expression(CODE, "mn.create_multi_node_evaluator(Evaluator(it, model), comm)")
    assert_no_expression(CODE, "mn.create_multi_node_evaluator(..., gather=False)")


def test_a_longer_name_holding_the_text_does_not_match() -> None:
    """Where ``"comm" in text`` or ``"'flat'" in text`` would pass on a name or a longer call."""
    assert not find_expressions(CODE, "comm.size")
    assert not find_statements(CODE, "name = 'flat'")
    assert not find_expressions(CODE, "mn.create_communicator('flat')")
    assert find_expressions(CODE, "'flat'")


def test_constants_compare_by_type() -> None:
    assert_has_statement(CODE, "flag = 1")
    assert not find_statements(CODE, "flag = True")


def test_within_looks_only_inside_that_function() -> None:
    assert_has_statement(CODE, "import chainermn.links")
    assert not find_statements(CODE, "import chainermn.links", within="main")
    with pytest.raises(AssertionError, match="no function"):
        find_statements(CODE, "x = 1", within="absent")


def test_names_used_covers_names_attributes_and_imports() -> None:
    used = names_used(CODE)
    assert {"chainermn", "links", "mnify", "runtime", "mn", "create_mnbn_model", "comm"} <= used
    assert "create" not in used and "gather" not in used  # parts of names, keywords: no
    assert_no_name(CODE, "scatter_dataset", "LinearWarmup")
    with pytest.raises(AssertionError, match="create_mnbn_model"):
        assert_no_name(CODE, "scatter_dataset", "create_mnbn_model")


def test_no_keyword() -> None:
    assert_no_keyword(CODE, "shuffle")
    with pytest.raises(AssertionError, match="gather= passed"):
        assert_no_keyword(CODE, "gather")


def test_contains_takes_a_lone_expression_anywhere_and_statements_in_a_block() -> None:
    assert contains(CODE, "mn.links.create_mnbn_model(model, comm)")  # inside an assignment
    assert contains(CODE, "comm = mn.create_communicator(...)")
    assert not contains(CODE, "model = mn.links.create_mnbn_model(comm, model)")


def test_top_level_leaves_nested_blocks_out() -> None:
    assert find_statements(CODE, "print('ready')\nprint('set')", within="main")
    assert not find_statements(CODE, "print('ready')\nprint('set')", within="main", top_level=True)
    assert find_statements(CODE, "flag = 1", within="main", top_level=True)


def test_index_of_and_is_statement_look_at_one_block() -> None:
    main = next(s for s in ast.parse(CODE).body if isinstance(s, ast.FunctionDef))
    assert index_of(main.body, "comm = mn.create_communicator(...)") == 1
    assert is_statement(main.body[4], "if comm.rank == 0:\n    ...")
    with pytest.raises(AssertionError, match="among"):
        index_of(main.body, "print('ready')")  # nested in the if, not in main's block
