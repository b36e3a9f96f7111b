"""The flags of ``impactrl train`` (and ``bench``): tyro parses them into a ``TrainConfig`` onto
the settings below them (``impactrl.config.resolve``); here only what tyro does not do, and its
one-line errors.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import sys
from types import MappingProxyType

import docstring_parser
import tyro

from impactrl.config import TrainConfig, integer_settings
from impactrl.errors import UserError


def parse_train_flags(base: TrainConfig, args: list[str]) -> TrainConfig:
    """tyro's parse of the train flags; its error box (nine lines for a bad number) becomes its
    first paragraph, in one line."""
    help_from_docstrings()
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            config = tyro.cli(TrainConfig, default=base, args=whole_numbers(args), prog="impactrl train")
    except SystemExit as exit_:
        if exit_.code in (0, None):  # --help
            raise
        raise UserError(f"{box_message(captured.getvalue())} (see impactrl train --help)") from None
    sys.stderr.write(captured.getvalue())  # tyro's warnings, if any
    return config


@functools.cache
def help_from_docstrings() -> None:
    """Give each setting its docstring as one paragraph in the ``help`` metadata tyro reads first:
    tyro (1.0) joins a field docstring's lines before dedenting them, so each indented
    continuation line would start a new line in ``--help``. Once per process, and only in the
    one that parses flags (reading the settings' source takes ~80 ms)."""
    for settings in TrainConfig.__mro__[:-1]:
        for param in docstring_parser.parse_from_object(settings).params:
            field = TrainConfig.__dataclass_fields__.get(param.arg_name)
            if field is not None and param.description and "help" not in field.metadata:
                field.metadata = MappingProxyType({**field.metadata, "help": " ".join(param.description.split())})


def whole_numbers(args: list[str]) -> list[str]:
    """The flags with each integer setting's integer-valued number (``--total-env-steps 1e6``) written as
    an integer; a fraction (``1.5``) is refused. Words that are no number are left to the parser."""
    integers = integer_settings()
    out = list(args)
    for i, arg in enumerate(args):
        flag, equals, value = arg.partition("=")
        at = i if equals else i + 1
        if not arg.startswith("--") or flag[2:].replace("-", "_") not in integers or at == len(args):
            continue
        value = value if equals else args[at]
        if re.fullmatch(r"[-+]?[0-9_]+", value.strip()):
            continue  # an integer already
        try:
            number = float(value)
        except ValueError:
            continue
        if not number.is_integer():
            raise UserError(f"{flag} must be an integer, got {value} (see impactrl train --help)")
        out[at] = f"{flag}={int(number)}" if equals else str(int(number))
    return out


def box_message(text: str) -> str:
    """The first paragraph of a tyro error box (the lines before its first rule), joined.

    The one place tyro's output is read back: tyro (1.0) has no public way to get a parse error's
    text. It prints the box to stderr and raises ``SystemExit(2)``; ``console_outputs=False`` drops
    the text, and its hook for errors (``tyro._errors.on_parse_error``) is private and unstable."""
    lines = [line.strip().strip("│╭╮╰╯").strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()]
    paragraph = []
    for line in lines[1:]:  # lines[0] is the box's title
        if set(line) <= set("─"):  # a rule, or an empty line
            if paragraph:
                break
            continue
        paragraph.append(line)
    message = " ".join(paragraph) or " ".join(line for line in lines if line) or "cannot parse the flags"
    return message.removeprefix("Error parsing ")


def flag_name(arg: str) -> str:
    """``--no-use-lstm`` and ``--learning-rate=0.1`` -> the setting names ``use_lstm``, ``learning_rate``."""
    name = arg[2:].split("=", 1)[0].replace("-", "_")
    return name[3:] if name.startswith("no_") else name
