"""Wall time at which a run's mean episode return first reached a target (from metrics.jsonl)."""

import argparse
import json
import os
import time
from pathlib import Path

from impactrl.metrics import read_metrics

parser = argparse.ArgumentParser()
parser.add_argument("run", type=Path)
parser.add_argument("target", type=float)
parser.add_argument("--system", required=True)
parser.add_argument("--seed", type=int)
parser.add_argument("--started", type=float, help="epoch seconds when the command started")
args = parser.parse_args()
metrics = args.run / "metrics.jsonl"
records = read_metrics(metrics)
hit = next((r for r in records if (r["episode_return_mean"] or float("-inf")) >= args.target), None)
# Training time is measured by the learner; the command's own start-up (imports, spawning the
# actors) is added from the file times so it is comparable with RLlib's time from ray.init.
startup = os.path.getctime(args.run / "config.yaml") - args.started if args.started else None
print(json.dumps({"system": args.system, "seed": args.seed, "target_return": args.target,
                  "time_to_target_s": hit["wall_time_s"] if hit else None,
                  "env_steps_to_target": hit["env_steps"] if hit else None, "startup_s": startup,
                  "finished_at": time.time()}))
