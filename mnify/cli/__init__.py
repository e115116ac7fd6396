"""The ``mnify`` command: a click group whose subcommands live one per module.

Each subcommand module (``convert``, ``lint``, ``run``, ``doctor``) defines a click command and
is imported only when that command runs, so ``mnify lint`` never pays for MPI or Chainer imports.
Exit codes follow ruff/black: 0 clean, 1 findings or would change, 2 usage or internal error.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from mnify import __version__

# command name -> (module, attribute, one-line help shown by `mnify --help`)
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "convert": (
        "mnify.cli.convert",
        "convert",
        "Rewrite single-GPU Chainer scripts to run on N ranks.",
    ),
    "lint": ("mnify.cli.lint", "lint", "Report distributed-training hazards."),
    "explain": ("mnify.cli.lint", "explain", "Explain one rule: what, why, bad and good example."),
    "rules": ("mnify.cli.lint", "rules", "List every rule."),
    "run": ("mnify.cli.run", "run", "Launch a script on N ranks with mpiexec; summarise failures."),
    "doctor": ("mnify.cli.doctor", "doctor", "Report MPI, mpi4py, CuPy, NCCL, CUDA and Chainer."),
    "scale": (
        "mnify.cli.scale",
        "scale",
        "Run a script at several rank counts; report the speed-up and what costs the rest.",
    ),
    "timeline": (
        "mnify.cli.timeline",
        "timeline",
        "Merge per-rank timelines into a Chrome trace; report stragglers; plot waiting.",
    ),
}


class _LazyGroup(click.Group):
    """Imports a subcommand's module only when that subcommand is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = _COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module, attr, _ = entry
        try:
            command: Any = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise click.ClickException(f"'{cmd_name}' is not available: {exc}") from exc
        return command  # type: ignore[no-any-return]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, _COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mnify")
def main() -> None:
    """mnify: make a single-GPU Chainer training script run on many GPUs and nodes."""
