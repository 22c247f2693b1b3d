"""The ``sarc`` command line: one module per command (``train``, ``compile``,
``partition``, ``worker``), each with its ``add_*_parser`` in ``SUBCOMMANDS``, and
``options``, what they share.

A subcommand is a function ``add_NAME_parser(subparsers)`` that adds its
parser and sets ``func`` (``parser.set_defaults(func=NAME_command)``) to a
function ``NAME_command(args) -> int`` (the exit status). Adding one is a
line in ``SUBCOMMANDS``. A command checks every value it is given before any
work (``check_train_args``): before a dataset is loaded or partitioned, a worker
launched or an epoch trained; a result file's directory must exist and be
writable by then. Errors sarc raises on the user's behalf (a mistake in the
model file, a missing dataset, bad arguments: ``SarcError``) print as one
``sarc: error: ...`` message, with the model file's line where there is one,
and exit with status 2; anything else is a bug in sarc and keeps its traceback.
"""
from __future__ import annotations

import argparse
import codecs
import contextlib
import faulthandler
import os
import signal
import sys
import warnings
from typing import Any, Callable

from .. import names
from ..errors import SarcError, SarcWarning
from ..loader import parse_overrides
from .options import ArgumentParser, UsageError, attach_values, check_no_empty_inputs


def _train_parser(subparsers):
    from .train import add_train_parser
    return add_train_parser(subparsers)


def _compile_parser(subparsers):
    from .compile import add_compile_parser
    return add_compile_parser(subparsers)


def _partition_parser(subparsers):
    from .partition import add_partition_parser
    return add_partition_parser(subparsers)


def _worker_parser(subparsers):
    from .worker import add_worker_parser
    return add_worker_parser(subparsers)


SUBCOMMANDS: tuple[Callable[[Any], Any], ...] = (_train_parser, _compile_parser,
                                                  _partition_parser, _worker_parser)
"""Every subcommand, in the order ``sarc --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="sarc", description="sarc: a compiler for "
                            "distributed training of graph neural networks")
    from ..version import __version__
    parser.add_argument("--version", action="version", version=f"sarc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def _printable(said: object) -> str:
    """An error's or warning's text with every non-printable character but its line breaks
    (a name's terminal escapes) shown escaped (``names.one_line``)."""
    return "\n".join(map(names.one_line, str(said).split("\n")))


@contextlib.contextmanager
def _warnings_said(command: str):
    """sarc's warnings (``SarcWarning``) printed as its errors are, without Python's file and
    line of the ``warnings.warn`` call: the message names the input it is about."""
    show = warnings.showwarning

    def said(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, SarcWarning):
            return show(message, category, filename, lineno, file, line)
        print(f"sarc {command}: warning: {_printable(message)}",
              file=sys.stderr if file is None else file)

    warnings.showwarning = said
    try:
        yield
    finally:
        warnings.showwarning = show


def _escape(err: UnicodeError):
    """An output error handler: a file name's undecodable bytes written back as those bytes
    (``surrogateescape``), any other character the encoding lacks as ``\\xe9``."""
    try:
        return codecs.lookup_error("surrogateescape")(err)
    except UnicodeError:
        return codecs.backslashreplace_errors(err)


_ESCAPE = "sarc-escape"
codecs.register_error(_ESCAPE, _escape)


def main(argv: list[str] | None = None) -> int:
    # where a command seems stuck: ``kill -USR1 PID`` prints its threads' stacks
    # (``sarc.distributed.stacks``: sarc train --workers P adds its workers'); not where
    # stderr is no file (main called with its output captured, as by a test)
    with contextlib.suppress(OSError, ValueError):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    # a name of the user's (a class named Lé) printed under a locale that cannot encode it
    # (LC_ALL=C): escaped, not an error; a file name's undecodable bytes still as its bytes
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):   # not a file's
            if stream.errors in ("strict", "surrogateescape"):   # the C locale's
                stream.reconfigure(errors=_ESCAPE)
    try:   # building the parser imports the subcommands (torch): seconds, interruptible
        args = build_parser().parse_args(attach_values(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    try:
        check_no_empty_inputs(args)
        with _warnings_said(args.command):
            return int(args.func(args) or 0)
    except SarcError as e:
        print(f"sarc {args.command}: error: {_printable(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of stdout went away (sarc compile ... | head): stop quietly, as a
        # shell command does; stdout points at devnull so the interpreter's flush at exit
        # does not fail again
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


__all__ = ["main", "build_parser", "SUBCOMMANDS", "UsageError", "parse_overrides"]
