"""Settings renamed to say what they count. Each old name still works for a while, by flag
(``--old-name``), in YAML (``--config``, a resumed run's ``config.yaml``) and in the Python API,
with a one-line warning; saved runs (checkpoints, config.yaml read by eval, diagnose and plot)
are read under the new names without one. Remove an entry once its old name has had its time."""

from __future__ import annotations

import sys
from typing import Any

from impactrl.errors import UserError

RENAMED: dict[str, str] = {  # old name: new name
    "batch_size": "unrolls_per_batch",  # it counts unrolls (and PPO ignores it: its batch is one unroll per env)
    "queue_slots": "rollout_slots",  # shared-memory rollout slots, not a queue; in effect: effective_rollout_slots
    "target_update_interval": "target_update_period",  # 0 = auto; the period in effect: effective_target_update_period
}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def warn(old: str, new: str, where: str = "") -> None:
    print(f"impactrl train: warning: {where}{old} is now {new} (the old name will be removed)", file=sys.stderr)


def renamed_settings(values: dict[str, Any], source: str, warn_old: bool = False) -> dict[str, Any]:
    """``values`` under the current names; with ``warn_old`` a warning for each old name."""
    out = {}
    for name, value in values.items():
        new = RENAMED.get(name)
        if new is not None and new in values:
            raise UserError(f"{source}: {name} and {new} are one setting ({name} is its old name): keep {new}")
        if new is not None and warn_old:
            warn(name, new, f"{source}: ")
        out[new or name] = value
    return out


def renamed_flags(args: list[str]) -> list[str]:
    """The flags under the current names (``--old-name V``, ``--old-name=V``), each old one warned about once."""
    old_flags = {flag(old): flag(new) for old, new in RENAMED.items()}
    out, warned = [], set()
    for arg in args:
        name, equals, value = arg.partition("=")
        if name in old_flags:
            if name not in warned:
                warn(name, old_flags[name])
                warned.add(name)
            arg = old_flags[name] + equals + value
        out.append(arg)
    return out


def old_flags_help() -> str:
    """One line for ``impactrl train --help`` naming the old flags still taken ('' when none)."""
    if not RENAMED:
        return ""
    pairs = ", ".join(f"{flag(old)} (now {flag(new)})" for old, new in RENAMED.items())
    return f"  old names still taken, with a warning: {pairs}\n"
