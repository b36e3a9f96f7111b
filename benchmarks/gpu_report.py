"""One JSON line for a step of ``benchmarks/gpu.sh``: what the step's command printed (the last
JSON object of ``impactrl bench --json``, or pytest's summary), merged with the GPU utilisation
and memory that ``nvidia-smi -lms 500`` sampled while it ran, the step's exit code, the git
commit and the date. gpu.sh calls it once per step and appends the line to
``benchmarks/results/gpu.jsonl``.

GPU utilisation is averaged twice: over the bench's measured window (the ``measured_s`` seconds
before its last sample, so after the warm-up; it takes in the 1-2 s of shutdown too) and over
the whole run, start-up included.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def last_json_object(path: Path) -> dict[str, Any] | None:
    """The last line of ``path`` that parses as a JSON object (bench --json prints one)."""
    if not path.is_file():
        return None
    for line in reversed(path.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def gpu_samples(path: Path | None) -> list[tuple[float, float, float]]:
    """(unix time, utilisation %, memory used MiB) per nvidia-smi line
    ``timestamp, utilization.gpu, memory.used``; lines that do not parse ([N/A]) are skipped."""
    if path is None or not path.is_file():
        return []
    samples = []
    for line in path.read_text(errors="replace").splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 3:
            continue
        try:
            stamp = datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((stamp, float(fields[1]), float(fields[2])))
        except ValueError:
            continue
    return samples


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def gpu_fields(samples: list[tuple[float, float, float]], window_s: float | None) -> dict[str, Any]:
    if not samples:
        return {"gpu_util_mean": None, "gpu_util_mean_run": None, "gpu_mem_used_mib_max": None, "gpu_samples": 0}
    end = samples[-1][0]
    window = [s for s in samples if window_s is None or s[0] >= end - window_s]
    return {"gpu_util_mean": mean([s[1] for s in window]), "gpu_util_mean_run": mean([s[1] for s in samples]),
            "gpu_mem_used_mib_max": max(s[2] for s in samples), "gpu_samples": len(window)}


def parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def command_output(*command: str) -> str | None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip().splitlines()[0] if result.returncode == 0 and result.stdout.strip() else None


def pytest_summary(path: Path) -> str | None:
    """pytest -q's last line ("5 passed in 3.1s")."""
    if not path.is_file():
        return None
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip("= ") if lines else None


def report(args: argparse.Namespace) -> dict[str, Any]:
    line: dict[str, Any] = {"measurement": args.measurement, "ok": args.rc == 0, "rc": args.rc,
                            "timed_out": args.rc in (124, 137)}
    line.update({key: parse_value(value) for key, value in (item.split("=", 1) for item in args.set)})
    if args.kind == "pytest":
        line["pytest"] = pytest_summary(args.output)
        samples = gpu_samples(args.gpu_samples)
        line.update(gpu_fields(samples, None))
    else:
        bench = last_json_object(args.output) or {}
        rate = bench.get("env_steps_per_s")
        # The learner's idle share: time/learner_wait_fraction in metrics.jsonl, which is the
        # receive stage's share (bench's learner_receive_fraction).
        idle = bench.get("learner_wait_fraction", bench.get("learner_receive_fraction"))
        line.update({"env_steps_per_s": rate, "learner_idle_fraction": idle})
        if rate is not None and args.frames_per_step:
            line["frames_per_s_per_core"] = rate * args.frames_per_step / (os.cpu_count() or 1)
        if args.publish_ms and rate is not None and bench.get("updates_per_s"):
            line["publish_ms_per_publication"] = 1000 * bench["learner_publish_fraction"] / bench["updates_per_s"]
        line.update(gpu_fields(gpu_samples(args.gpu_samples), bench.get("measured_s")))
        line.update({key: value for key, value in bench.items() if key not in line})
    if args.rc != 0 and args.log is not None and args.log.is_file():
        errors = [text for text in args.log.read_text(errors="replace").splitlines() if text.strip()]
        line["error"] = errors[-1][-500:] if errors else None
    line.update({"gpu": command_output("nvidia-smi", "-i", args.gpu_index, "--query-gpu=name", "--format=csv,noheader"),
                 "cpu_count": os.cpu_count(), "commit": command_output("git", "rev-parse", "HEAD"),
                 "date": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measurement", required=True, help="the step's name in the line")
    parser.add_argument("--kind", choices=["bench", "pytest"], default="bench", help="what --output holds")
    parser.add_argument("--output", type=Path, required=True, help="the step's stdout")
    parser.add_argument("--gpu-samples", type=Path, help="nvidia-smi's CSV samples taken while the step ran")
    parser.add_argument("--rc", type=int, default=0, help="the step's exit code (124/137: timed out)")
    parser.add_argument("--log", type=Path, help="the step's stderr: its last line goes into a failed step's line")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a field to add (VALUE read as JSON where it parses)")
    parser.add_argument("--frames-per-step", type=int, help="emulator frames per env step (Atari: 4), for frames/s per core")
    parser.add_argument("--publish-ms", action="store_true", help="add the learner's ms per weight publication")
    parser.add_argument("--gpu-index", default="0", help="the GPU nvidia-smi names")
    print(json.dumps(report(parser.parse_args())), flush=True)


if __name__ == "__main__":
    main()
