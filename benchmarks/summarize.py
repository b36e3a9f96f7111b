"""Turn benchmarks/results/*.jsonl into the tables of benchmarks/README.md and a plot."""

import json
from collections import defaultdict
from pathlib import Path
from statistics import mean

RESULTS = Path(__file__).parent / "results"


def read(name: str) -> list[dict]:
    path = RESULTS / name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def main() -> None:
    ceiling = {r["env"]: r for r in read("env_ceiling.jsonl")}
    throughput = defaultdict(dict)
    for r in read("throughput.jsonl"):
        throughput[r["env"]][r["system"]] = r["env_steps_per_s"]
    systems = ["impactrl-impala", "rllib-appo", "rllib-impala"]
    print("| env | " + " | ".join(systems) + " | impactrl / RLlib APPO | raw env, 1 process | raw env, all cores | impactrl / raw all cores |")
    print("|---|" + "---|" * (len(systems) + 4))
    for env, rates in throughput.items():
        ours, appo = rates.get("impactrl-impala"), rates.get("rllib-appo")
        raw = ceiling.get(env, {})
        cells = [f"{rates[s]:,.0f}" if rates.get(s) else "—" for s in systems]
        ratio = f"{ours / appo:.1f}×" if ours and appo else "—"
        all_cores = raw.get("all_processes_steps_per_s")
        share = f"{ours / all_cores:.0%}" if ours and all_cores else "—"
        print(f"| {env} | " + " | ".join(cells) + f" | {ratio} | {raw.get('one_process_steps_per_s', 0):,.0f} | "
              f"{all_cores or 0:,.0f} | {share} |")
    times = defaultdict(list)
    for r in read("cartpole_time_to_450.jsonl"):
        if r["time_to_target_s"] is not None:
            times[r["system"]].append(r["time_to_target_s"] + (r.get("startup_s") or 0.0))
    if times:
        print("\n| system | CartPole time to 450 (s, incl. start-up), per run | mean | ratio to RLlib APPO |")
        print("|---|---|---|---|")
        reference = mean(times["rllib-appo"]) if times.get("rllib-appo") else None
        for system, values in times.items():
            ratio = f"{mean(values) / reference:.2f}×" if reference else "—"
            print(f"| {system} | {', '.join(f'{v:.1f}' for v in values)} | {mean(values):.1f} | {ratio} |")


if __name__ == "__main__":
    main()
