"""Turn benchmarks/results/*.jsonl into the tables of benchmarks/README.md and benchmarks/throughput.png."""

import json
from collections import defaultdict
from pathlib import Path
from statistics import mean

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent
RESULTS = HERE / "results"
ENVS = ["CartPole-v1", "MinAtar/Breakout-v1", "ALE/Pong-v5"]
REFERENCE = "rllib-appo, matched envs"


def read(name: str) -> list[dict]:
    path = RESULTS / name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def label(record: dict) -> str:
    if record["system"].startswith(("rllib", "sample-factory")):
        return f"{record['system']}, {'1 env' if record['envs_per_worker'] == 1 else 'matched envs'}"
    return record["system"]


def rate(value: float | None) -> str:
    return f"{value:,.0f}" if value else "—"


def throughput_table() -> dict[str, dict[str, float]]:
    """The latest measurement per env and system."""
    ceiling = {r["env"]: r for r in read("env_ceiling.jsonl") if r.get("backend", "gymnasium") == "gymnasium"}
    rates: dict[str, dict[str, float]] = defaultdict(dict)
    for r in read("throughput.jsonl"):
        rates[r["env"]][label(r)] = r["env_steps_per_s"]
    systems = sorted({system for per_env in rates.values() for system in per_env})
    print("| env | " + " | ".join(systems) + " | impactrl best / RLlib APPO (matched, 1 env) "
          "| raw env: 1 process, 2 processes | impactrl best / raw 2 processes |")
    print("|---|" + "---|" * (len(systems) + 3))
    for env in ENVS:
        per_env = rates.get(env, {})
        ours = max((v for k, v in per_env.items() if k.startswith("impactrl") and v), default=None)
        ratios = [f"{ours / per_env[ref]:.1f}×" if ours and per_env.get(ref) else "—"
                  for ref in (REFERENCE, "rllib-appo, 1 env")]
        raw = ceiling.get(env, {})
        two = raw.get("all_processes_steps_per_s")
        share = f"{ours / two:.0%}" if ours and two else "—"
        print(f"| {env} | " + " | ".join(rate(per_env.get(s)) for s in systems) + f" | {', '.join(ratios)} "
              f"| {rate(raw.get('one_process_steps_per_s'))}, {rate(two)} | {share} |")
    return rates


def envpool_ceiling_table() -> None:
    rows = {(r["env"], r.get("backend", "gymnasium")): r for r in read("env_ceiling.jsonl") if "envs_per_process" in r}
    if not any(backend == "envpool" for _, backend in rows):
        return
    print("\n| env | raw Gymnasium: 1 process, 2 processes | raw EnvPool: 1 process, 2 processes | (8 envs per process) |")
    print("|---|---|---|---|")
    for env in ENVS:
        cells = [f"{rate(r.get('one_process_steps_per_s'))}, {rate(r.get('all_processes_steps_per_s'))}"
                 for r in (rows.get((env, "gymnasium"), {}), rows.get((env, "envpool"), {}))]
        print(f"| {env} | {cells[0]} | {cells[1]} | |")


def central_table() -> None:
    rows = {(r["env"], r["layout"]): r["env_steps_per_s"] for r in read("central_inference.jsonl")}
    if not rows:
        return
    print("\n| env | actor-side inference (impactrl) | central inference (SEED-style) | central / actor-side |")
    print("|---|---|---|---|")
    for env in ENVS:
        ours, central = rows.get((env, "actor-side")), rows.get((env, "central"))
        if ours and central:
            print(f"| {env} | {rate(ours)} | {rate(central)} | {central / ours:.2f}× |")


def time_table() -> None:
    runs = defaultdict(list)
    for r in read("cartpole_time_to_450.jsonl"):
        runs[r["system"]].append(r)
    # run.sh measures three runs per system; the latest three are its latest measurement.
    times = {system: [r["time_to_target_s"] + (r.get("startup_s") or 0.0) for r in records[-3:]
                      if r["time_to_target_s"] is not None] for system, records in runs.items()}
    if not times:
        return
    print("\n| system | CartPole time to 450 (s, incl. start-up), per run | mean | ratio to RLlib APPO |")
    print("|---|---|---|---|")
    reference = mean(times["rllib-appo"]) if times.get("rllib-appo") else None
    for system, values in times.items():
        ratio = f"{mean(values) / reference:.2f}×" if reference else "—"
        print(f"| {system} | {', '.join(f'{v:.1f}' for v in values)} | {mean(values):.1f} | {ratio} |")


def learner_table() -> None:
    rows = list({r["env"]: r for r in read("learner_overhead.jsonl")}.values())  # the latest per env
    if not rows:
        return
    print("\n| env | batch (unrolls × T) | bare PyTorch step | impactrl learner step | publish weights | learner / bare |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['env']} | {r['batch_unrolls']} × {r['unroll_length']} | {r['bare_ms']:.2f} ms | "
              f"{r['learner_ms']:.2f} ms | {r['publish_ms']:.2f} ms | {r['learner_over_bare']:.2f} |")


def plot(rates: dict[str, dict[str, float]]) -> None:
    systems = sorted({system for per_env in rates.values() for system in per_env})
    envs = [env for env in ENVS if env in rates]
    if not envs:
        return
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        values = [rates[env].get(system, 0.0) for env in envs]
        ax.bar([e + i * width for e in range(len(envs))], values, width, label=system)
    ax.set_xticks([e + 0.4 - width / 2 for e in range(len(envs))], envs)
    ax.set_yscale("log")
    ax.set_ylabel("env steps/s while training (log)")
    ax.set_title("Training throughput, 2 env workers, 2 CPU cores, one machine")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "throughput.png", dpi=110)


def main() -> None:
    rates = throughput_table()
    envpool_ceiling_table()
    central_table()
    time_table()
    learner_table()
    plot(rates)


if __name__ == "__main__":
    main()
