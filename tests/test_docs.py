"""The commands the docs show still run as written: their flags exist, and a train command's
settings pass the same checks ``impactrl train`` makes before it starts a process.

Placeholders stand for what the reader picks: RUN/RUNS/DIR (a directory), S (a seed), ALGO,
GAME; ``[--flag value]`` is an option the reader may add. Commands that continue a run
(``--resume``), elide flags (``...``), join a cluster that only the reader has, or stand inline
in the prose (often sketches: ``impactrl bench --env ENV``) are checked for their flags only.
"""

import importlib
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from impactrl.cli import resolve_train_config
from impactrl.preflight import validate_train

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "experiments" / "README.md",
        ROOT / "benchmarks" / "README.md"]
COMMAND = re.compile(r"(impactrl|python (experiments|benchmarks)/\w+\.py) ")


def documented_commands() -> list[tuple[str, str, bool]]:
    """(doc name, command, whether it stands in a fenced code block) for each command the docs show."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        name = doc.relative_to(ROOT).as_posix()
        for block in re.findall(r"```\w*\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                if COMMAND.match(line.strip()):
                    found.append((name, line.strip(), True))
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        found += [(name, span, False) for span in re.findall(r"`([^`\n]+)`", prose) if COMMAND.match(span)]
    return found


def words(command: str) -> list[str]:
    """The command's words with the placeholders filled in and optional flags taken."""
    return ["1" if word == "S" else word.replace("GAME", "Breakout").replace("ALGO", "impala")
            for word in shlex.split(command.replace("[", "").replace("]", ""), comments=True)]


def flags_in(args: list[str]) -> set[str]:
    return {arg.split("=", 1)[0] for arg in args if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", arg)}


@cache
def flags_of(program: tuple[str, ...], negatable: bool = False) -> frozenset[str]:
    """The --flags a program's --help lists (with ``negatable``, each also as --no-flag: how
    `impactrl train` takes its booleans)."""
    result = subprocess.run([sys.executable, *program, "--help"], capture_output=True, text=True, cwd=ROOT,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    flags = set(re.findall(r"--[a-z][a-z0-9-]*", result.stdout))
    return frozenset(flags | {"--no-" + flag[2:] for flag in flags} if negatable else flags)


TRAIN = ("-m", "impactrl", "train")


def program_and_args(argv: list[str]) -> tuple[tuple[str, ...], list[str]]:
    if argv[0] == "impactrl":
        return ("-m", "impactrl", argv[1]), argv[2:]
    return (argv[1],), argv[2:]


COMMANDS = documented_commands()


def test_the_docs_show_commands():
    docs = {doc for doc, _, _ in COMMANDS}
    assert {"README.md", "docs/results.md", "docs/guide.md"} <= docs and len(COMMANDS) > 80


@pytest.mark.parametrize("doc,command,fenced", COMMANDS, ids=[f"{doc}:{i}" for i, (doc, _, _) in enumerate(COMMANDS)])
def test_a_documented_command_runs_as_written(doc: str, command: str, fenced: bool, tmp_path: Path):
    program, args = program_and_args(words(command))
    train = program[-1] == "train"
    used = flags_in(args)
    known = flags_of(program, train) | (flags_of(TRAIN, True) if program[-1] in ("bench", "tune") else frozenset())
    unknown = used - known  # (impactrl bench and tune take every train flag besides their own)
    if "--extra" in args:  # an experiment's flags for every impactrl train it runs
        unknown |= flags_in(shlex.split(args[args.index("--extra") + 1])) - flags_of(TRAIN, True)
    assert not unknown, f"{doc}: `{command}` has flags its program lacks: {sorted(unknown)}"
    if not (train and fenced) or "..." in command or {"--resume", "--ray-address"} & used:
        return
    if "--out" in args:
        args[args.index("--out") + 1] = str(tmp_path / "run")
    request = resolve_train_config(args)
    validate_train(request.config, request.resume)


def test_every_cited_section_of_the_algorithms_page_exists():
    """Code and docs cite sections of docs/algorithms.md by anchor; each is a heading there (GitHub's slugs)."""
    page = re.sub(r"```.*?```", "", (ROOT / "docs" / "algorithms.md").read_text(), flags=re.S)
    anchors = {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
               for heading in re.findall(r"^#{1,6} (.+)$", page, re.M)}
    cited = {}
    for folder in ("impactrl", "tests", "benchmarks", "experiments", "docs"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".yaml") and path.is_file():
                for anchor in re.findall(r"algorithms\.md#([a-z0-9-]+)", path.read_text()):
                    cited.setdefault(anchor, path)
    assert cited and {anchor: str(path) for anchor, path in cited.items() if anchor not in anchors} == {}


def test_the_design_pages_trace_of_an_unroll_names_the_code():
    """docs/design.md traces one unroll from actor to update in at most ten hops, each naming the code as
    `impactrl/path.py: Name.attribute`; every such name must resolve, so the trace stays true."""
    page = (ROOT / "docs" / "design.md").read_text()
    section = page.split("\n## One unroll, from actor to update\n", 1)[1].split("\n## ", 1)[0]
    hops = re.findall(r"^\d+\. \*\*", section, re.M)
    names = re.findall(r"`(impactrl/[\w/]+)\.py: ([\w.]+)`", section)
    assert 0 < len(hops) <= 10 and len(names) >= len(hops)
    missing = []
    for path, name in names:
        try:
            target = importlib.import_module(path.replace("/", "."))
        except ImportError as error:
            if error.name == "ray":  # the Ray runtime's modules need the optional extra
                continue
            raise
        for part in name.split("."):
            target = getattr(target, part, None)
        if target is None:
            missing.append(f"{path}.py: {name}")
    assert missing == []
