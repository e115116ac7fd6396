"""``mn.rank0_log_files`` (mnify/runtime/log_config.py): rank 0 keeps a dictConfig's log files,
the other ranks get console handlers with the same level, formatter and filters, and the
configuration works with ``logging.config.dictConfig`` as it comes back on either rank."""

from __future__ import annotations

import logging
import logging.config
import logging.handlers
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mnify.runtime import rank0_log_files
from mnify.runtime.log_config import is_file_handler


@dataclass
class _Rank:
    rank: int


class _AuditFileHandler(logging.FileHandler):
    """A project's own file handler: a subclass counts as a file handler too."""


def _config(path: Path) -> dict[str, Any]:
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(levelname)s %(message)s"}},
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": "plain"},
            "file": {
                "class": "logging.FileHandler",
                "filename": str(path / "train.log"),
                "formatter": "plain",
                "level": "DEBUG",
            },
            "rotating": {
                "class": "logging.handlers.RotatingFileHandler",
                "filename": str(path / "debug.log"),
                "maxBytes": 1000,
                "backupCount": 2,
            },
            "audit": {"class": _AuditFileHandler, "filename": str(path / "audit.log")},
        },
        "loggers": {
            "mnify-test-log-config": {"handlers": ["console", "file", "rotating", "audit"]}
        },
    }


def test_rank_0_gets_the_configuration_as_written(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert rank0_log_files(config, _Rank(0)) is config


def test_other_ranks_log_to_the_console_with_the_same_format_and_level(tmp_path: Path) -> None:
    config = _config(tmp_path)
    other = rank0_log_files(config, _Rank(1))
    assert other["handlers"]["file"] == {
        "class": "logging.StreamHandler",
        "level": "DEBUG",
        "formatter": "plain",
    }
    assert other["handlers"]["rotating"] == {"class": "logging.StreamHandler"}
    assert other["handlers"]["audit"] == {"class": "logging.StreamHandler"}
    assert other["handlers"]["console"] is config["handlers"]["console"]
    assert other["loggers"] == config["loggers"]
    assert config["handlers"]["file"]["class"] == "logging.FileHandler"  # not changed in place
    logger = logging.getLogger("mnify-test-log-config")
    try:
        logging.config.dictConfig(other)
        logger.warning("from rank 1")
        assert list(tmp_path.iterdir()) == []  # no log file made
        assert all(type(h) is logging.StreamHandler for h in logger.handlers)
    finally:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()


def test_which_entries_are_file_handlers() -> None:
    assert is_file_handler({"class": "logging.handlers.TimedRotatingFileHandler"})
    assert is_file_handler({"class": "logging.handlers.WatchedFileHandler"})
    assert is_file_handler({"class": _AuditFileHandler})
    assert not is_file_handler({"class": "logging.StreamHandler"})
    assert not is_file_handler({"class": "logging.handlers.SocketHandler"})
    assert not is_file_handler({"class": "no.such.Handler"})
    assert not is_file_handler({"()": "ext://sys.stdout"})


def test_a_configuration_without_file_handlers_is_the_same_object() -> None:
    config = {"version": 1, "handlers": {"c": {"class": "logging.StreamHandler"}}}
    assert rank0_log_files(config, _Rank(3)) is config
