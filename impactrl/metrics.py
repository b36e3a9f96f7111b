"""Where metrics go: ``metrics.jsonl``, TensorBoard (``tb/``), ``train.log`` and the terminal.

Keys in ``metrics.jsonl`` (one JSON object per log interval; documented in docs/metrics.md):
env_steps, learner_updates, wall_time_s, episode_return_mean (episodes finished since the
previous line; null if none), episodes, env_steps_per_s, policy_lag_mean, policy_lag_max,
plus namespaced statistics (loss/..., vtrace/..., time/..., actor/<id>/...).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import select
import shutil
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import numpy as np
import torch

from impactrl.data.rollout import ACTOR_STAGES
from impactrl.errors import RunDirFailed, UserError, write_failed


class MetricsWriter:
    """metrics.jsonl, TensorBoard, ``RUN_DIR/train.log`` and the terminal.

    On a terminal (a TTY) a live tqdm bar shows the env steps of the budget with the ETA, steps/s,
    return, policy lag, learner idle time and the latest warning; on a pipe or file, one plain
    line per interval. ``train.log`` gets the plain lines and every message whatever the terminal
    shows; ``terminal=None`` (``--quiet``) shows nothing.
    """

    def __init__(self, run_dir: Path, total_env_steps: int, terminal: TextIO | None = sys.stdout,
                 wandb_run=None):
        from torch.utils.tensorboard import SummaryWriter

        self.wandb_run = wandb_run
        self.run_dir = Path(run_dir)
        self.jsonl_path, self.log_path, self.tb_path = (self.run_dir / name for name in ("metrics.jsonl", "train.log", "tb"))
        with self.writing(self.jsonl_path):
            drop_torn_tail(self.jsonl_path)  # a killed run's half line: the next one would glue onto it
            self.jsonl = open(self.jsonl_path, "ab", buffering=0)  # unbuffered: append_line's write is the file's
        with self.writing(self.log_path):
            self.log = open(self.log_path, "a", buffering=1)
        with self.writing(self.tb_path):
            self.tensorboard = SummaryWriter(str(self.tb_path))
        self._excepthook = quiet_tensorboard_thread()
        self.terminal = terminal
        self.total_env_steps = total_env_steps
        self.bar = None
        if terminal is not None and terminal.isatty():
            from tqdm import tqdm

            # A terminal that reports no size (some ptys) would hide the bar behind tqdm's own probe.
            size = shutil.get_terminal_size((120, 24))
            self.bar = tqdm(total=total_env_steps, unit="step", unit_scale=True, file=terminal, ncols=size.columns,
                            nrows=size.lines or 24,
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}")
        self.latest_warning = ""
        self.shown_steps: int | None = None  # the env steps of the last line shown

    @contextlib.contextmanager
    def writing(self, path: Path):
        """A failed write of ``path`` (a full disk, a read-only or deleted run directory) as RunDirFailed."""
        try:
            yield
        except OSError as error:
            raise write_failed(self.run_dir, path, error) from error

    def write(self, record: dict[str, Any]) -> None:
        with self.writing(self.jsonl_path):
            append_line(self.jsonl, json_line(record))
            if os.fstat(self.jsonl.fileno()).st_nlink == 0:  # writes to a deleted file succeed, unread
                raise FileNotFoundError(errno.ENOENT, "deleted while the run wrote to it")
        step = record["env_steps"]
        scalars = {key: value for key, value in flatten(record).items()
                   if key != "env_steps" and isinstance(value, (int, float)) and math.isfinite(value)}
        with self.writing(self.tb_path):
            for key, value in scalars.items():
                self.tensorboard.add_scalar(key, value, step)
        if self.wandb_run is not None:
            self.wandb_run.log({**scalars, "env_steps": step})
        if step == self.shown_steps:
            # The learner's closing line right after an interval's: no steps since, so no rate or
            # return to show, only a repeat of the line before with dashes.
            return
        self.shown_steps = step
        line = terminal_line(record, self.total_env_steps)
        with self.writing(self.log_path):
            self.log.write(line + "\n")
        with self.showing():
            if self.bar is not None:
                self.bar.update(min(step, self.total_env_steps) - self.bar.n)
                self.bar.set_postfix_str(status(record) + (f" | {self.latest_warning}" if self.latest_warning else ""))
            elif self.terminal is not None:
                print(line, file=self.terminal, flush=True)

    def message(self, text: str) -> None:
        """A line for the user (a restart, a warning): stderr and train.log."""
        self.log_only(text)
        with self.showing():
            if self.bar is not None:
                self.bar.write(f"impactrl: {text}", file=sys.stderr)
            elif self.terminal is not None:
                print(f"impactrl: {text}", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def showing(self):
        """Terminal output that may find the terminal gone (a closed pipe, a hung-up tty): the run
        goes on with train.log alone, and the dead stdout and stderr are pointed at /dev/null so
        that no later print (the final line, Python's exit flush) fails either."""
        try:
            yield
        except OSError as error:
            self.bar, self.terminal = None, None
            silence_closed_terminal()
            self.log_only(f"the terminal went away ({error.strerror or error}); lines go on to {self.log_path}")

    def log_only(self, text: str) -> None:
        """A line for train.log alone: one the CLI itself shows on the terminal (why the run stopped)."""
        with self.writing(self.log_path):
            self.log.write(f"impactrl: {text}\n")

    def warn(self, text: str) -> None:
        self.latest_warning = text.split("]")[0].strip("[")  # the rule's name fits the bar
        self.message(f"warning: {text}")

    def close(self) -> None:
        """Close everything; RunDirFailed for the first that could not be flushed."""
        if self.bar is not None:
            self.bar.close()
        failure = None
        for path, close in ((self.jsonl_path, self.jsonl.close), (self.log_path, self.log.close),
                            (self.tb_path, self.tensorboard.close)):
            try:
                with self.writing(path):
                    close()
            except RunDirFailed as error:
                failure = failure or error
        threading.excepthook = self._excepthook
        if self.wandb_run is not None:
            self.wandb_run.finish()
        if failure is not None:
            raise failure


def silence_closed_terminal() -> None:
    """Point stdout or stderr at /dev/null where its reader is gone (a closed pipe, a hung-up
    tty: Python's documented way to survive a closed pipe), so that no later write fails."""
    for stream in (sys.stdout, sys.stderr):
        try:
            poller = select.poll()
            poller.register(stream.fileno(), select.POLLOUT)
        except (ValueError, OSError):  # closed, or no file descriptor (a captured stream)
            continue
        if any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0)):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)


def quiet_tensorboard_thread():
    """Keep an OSError in TensorBoard's writer thread (a full disk) off stderr, where Python prints
    a thread's exception as a traceback; TensorBoard raises it again at our next write, where it
    becomes one line. Returns the hook to restore."""
    previous = threading.excepthook

    def hook(args) -> None:
        if not (type(args.thread).__name__ == "_AsyncWriterThread" and issubclass(args.exc_type, OSError)):
            previous(args)

    threading.excepthook = hook
    return previous


def append_line(file: BinaryIO, line: str) -> None:
    """Append ``line`` whole or not at all: on a failed write (a full disk) the file is cut back to
    its size before, so readers never meet half a line in the middle of the file."""
    data = memoryview((line + "\n").encode())
    start = file.seek(0, os.SEEK_END)
    try:
        while data:  # one write(2) in practice; a short one only when the disk fills up
            data = data[file.write(data):]
    except BaseException:
        with contextlib.suppress(OSError):
            file.truncate(start)
        raise


def drop_torn_tail(path: Path) -> None:
    """Cut ``path`` back to its last whole line: the half line a killed writer left would glue onto
    the next one appended (one missing only its newline gets it)."""
    if not path.exists():
        return
    with open(path, "r+b") as file:
        data = file.read()
        if not data or data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1
        try:
            json.loads(data[start:])
            file.write(b"\n")
        except ValueError:  # JSONDecodeError, UnicodeDecodeError
            file.truncate(start)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (every reader's). A last line that is not JSON is the one a
    running (or killed) run is writing and is left out; one before it means a damaged file
    (UserError). OSError when the file cannot be read."""
    lines = [(number, line) for number, line in enumerate(Path(path).read_text(errors="replace").splitlines(), 1)
             if line.strip()]
    records = []
    for number, line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            if number == lines[-1][0]:
                break
            raise UserError(f"{path}: line {number} is not JSON (the file is damaged; delete that line)") from None
    return records


def json_line(record: dict[str, Any]) -> str:
    """``record`` as strict JSON: NaN and Inf (an explained variance of constant targets) become
    null, which jq, JavaScript and pandas read, where Python's bare NaN token breaks them."""
    def finite(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {key: finite(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(item) for item in value]
        return value

    return json.dumps(finite(record), allow_nan=False)


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def status(record: dict[str, Any]) -> str:
    """Steps/s, return, lag, learner idle time and updates of a metrics line ('-' where unknown)."""
    rate, ret, lag = record["env_steps_per_s"], record["episode_return_mean"], record["policy_lag_mean"]
    idle = record.get("time/learner_wait_fraction")
    return "  ".join([
        f"{rate:,.0f}/s" if rate is not None else "-/s",
        f"return {ret:.2f} ({record['episodes']} ep)" if ret is not None else "return - (0 ep)",
        f"lag {lag:.2f}" if lag is not None else "lag -",
        f"learner idle {idle:.0%}" if idle is not None else "learner idle -",
        f"updates {record['learner_updates']:,}",
    ])


def terminal_line(record: dict[str, Any], total_env_steps: int) -> str:
    """One plain line: time, env steps of the budget with the ETA, then the status."""
    done, rate = record["env_steps"] / total_env_steps, record["env_steps_per_s"]
    eta = f"{(total_env_steps - record['env_steps']) / rate:5.0f}s" if rate and done < 1 else "    -"
    line = (f"[{record['wall_time_s']:7.1f}s] steps {record['env_steps']:>11,} ({min(done, 1):4.0%}, ETA {eta})  "
            f"{status(record)}")
    if "task" in record:
        line += "  | " + "  ".join(f"{label} {task['episode_return_mean']:.2f}" if task["episode_return_mean"] is not None
                                   else f"{label} -" for label, task in record["task"].items())
    return line


class IntervalStats:
    """Accumulates what happens between two metrics lines; ``steps_per_unroll`` is E × T.
    With ``task_labels`` (several tasks) the summary also has a ``task`` entry per task."""

    def __init__(self, steps_per_unroll: int, task_labels: tuple[str, ...] | None = None) -> None:
        self.steps_per_unroll = steps_per_unroll
        self.task_labels = task_labels
        self.reset()

    def reset(self) -> None:
        self.returns: list[float] = []
        self.lengths: list[float] = []
        self.episode_tasks: list[int] = []
        self.unroll_tasks: list[np.ndarray] = []
        self.lags: list[np.ndarray] = []
        self.ages: list[np.ndarray] = []
        self.actor_ids: list[np.ndarray] = []
        self.stage_seconds: list[np.ndarray] = []
        self.sums: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.device_sums: dict[str, torch.Tensor] = {}  # float64, where the statistics were computed
        self.device_counts: dict[str, torch.Tensor | int] = {}

    def add_episodes(self, returns: np.ndarray, lengths: np.ndarray, tasks: np.ndarray) -> None:
        self.returns.extend(returns.tolist())
        self.lengths.extend(lengths.tolist())
        self.episode_tasks.extend(tasks.tolist())

    def add_unrolls(self, actor_ids: np.ndarray, lags: np.ndarray, ages_s: np.ndarray,
                    stage_seconds: np.ndarray, tasks: np.ndarray) -> None:
        """Per unroll (one env's T steps): actor, policy lag, data age and task; per slot: stage times."""
        self.unroll_tasks.append(tasks)
        self.actor_ids.append(actor_ids)
        self.lags.append(lags)
        self.ages.append(ages_s)
        self.stage_seconds.append(stage_seconds)

    def add(self, stats: dict[str, float | torch.Tensor], taken: torch.Tensor | None = None) -> None:
        """One step's statistics, averaged over the interval. A tensor is summed where it is, in
        float64 (the sum of its Python floats), until ``summary`` reads all of them in one
        transfer; ``taken`` (a 0-dim bool tensor) leaves a step that was not taken out of them."""
        weight = 1 if taken is None else taken.double()
        for key, value in stats.items():
            if not isinstance(value, torch.Tensor):
                self.sums[key] += value
                self.counts[key] += 1
                continue
            value = value.detach().double()
            if taken is not None:
                value = torch.where(taken, value, 0.0)  # a skipped step's statistics may be NaN
            self.device_sums[key] = self.device_sums[key] + value if key in self.device_sums else value
            self.device_counts[key] = self.device_counts.get(key, 0) + weight

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "episode_return_mean": float(np.mean(self.returns)) if self.returns else None,
            "episode_return_std": float(np.std(self.returns)) if self.returns else None,
            "episode_length_mean": float(np.mean(self.lengths)) if self.lengths else None,
            "episodes": len(self.returns),
        }
        if self.lags:
            lags, ages, ids = np.concatenate(self.lags), np.concatenate(self.ages), np.concatenate(self.actor_ids)
            out["policy_lag_mean"] = float(lags.mean())
            out["policy_lag_max"] = int(lags.max())
            out["data_age_mean_s"] = float(ages.mean())
            out["actor"] = {
                str(actor): {"policy_lag_mean": float(lags[ids == actor].mean()),
                             "data_age_mean_s": float(ages[ids == actor].mean())}
                for actor in np.unique(ids).tolist()
            }
            # Where the actors' time went, over the unrolls the learner consumed in the interval.
            stages = np.concatenate(self.stage_seconds).sum(axis=0)
            for stage, seconds in zip(ACTOR_STAGES, stages.tolist()):
                out[f"time/actor_{stage}_fraction"] = seconds / max(stages.sum(), 1e-12)
            # How fast one actor's envs step on their own: the ceiling inference and waiting keep it from.
            unrolls = sum(len(per_slot) for per_slot in self.stage_seconds)
            env_seconds = float(stages[ACTOR_STAGES.index("env")])
            out["time/actor_env_steps_per_s"] = unrolls * self.steps_per_unroll / max(env_seconds, 1e-12)
        else:
            out.update(policy_lag_mean=None, policy_lag_max=None, data_age_mean_s=None)
        if self.task_labels is not None:
            out["task"] = self._per_task()
        for key, total in self.sums.items():
            out[key] = total / self.counts[key]
        if self.device_sums:
            sums = list(self.device_sums.values())
            counts = [torch.as_tensor(count, dtype=torch.float64, device=sums[0].device)
                      for count in self.device_counts.values()]
            read = torch.stack(sums + counts).tolist()
            for key, total, count in zip(self.device_sums, read, read[len(sums):]):
                if count:
                    out[key] = total / count
        return out

    def _per_task(self) -> dict[str, dict[str, Any]]:
        """Return, episodes and policy lag of each task over the interval (null where it had none)."""
        returns, episode_tasks = np.asarray(self.returns), np.asarray(self.episode_tasks, np.int64)
        lags = np.concatenate(self.lags) if self.lags else np.zeros(0)
        unroll_tasks = np.concatenate(self.unroll_tasks) if self.unroll_tasks else np.zeros(0, np.int64)
        out = {}
        for task, label in enumerate(self.task_labels):
            ended, unrolls = returns[episode_tasks == task], lags[unroll_tasks == task]
            out[label] = {"episode_return_mean": float(ended.mean()) if len(ended) else None,
                          "episodes": int(len(ended)),
                          "policy_lag_mean": float(unrolls.mean()) if len(unrolls) else None}
        return out
