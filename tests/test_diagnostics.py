"""Every diagnostic rule on synthetic metrics: it fires on the symptom, with numbers and a flag,
and stays quiet on a healthy run."""

import dataclasses
import json

import pytest

from conftest import FAST, run_cli
from impactrl.cli import main
from impactrl.config import TrainConfig, to_yaml
from impactrl.diagnostics import RULES, REPEAT_S, WARMUP_S, LiveDiagnostics, diagnose

CONFIG = TrainConfig(env="CartPole-v1", total_env_steps=1_000_000, num_actors=1)


def healthy(i: int, **changes) -> dict:
    """One metrics line of an unremarkable run, ``i`` log intervals (5 s each) in."""
    record = {
        "env_steps": 10_000 * (i + 1), "wall_time_s": 5.0 * (i + 1), "learner_updates": 50 * (i + 1),
        "env_steps_per_s": 20_000.0, "episode_return_mean": 10.0 + 5 * i, "episode_return_std": 5.0,
        "episodes": 100, "policy_lag_mean": 2.0,
        "policy_lag_max": 4, "time/learner_wait_fraction": 0.2, "time/actor_wait_fraction": 0.1,
        "time/actor_inference_fraction": 0.4, "time/actor_env_steps_per_s": 50_000.0,
        "vtrace/rho_extreme_fraction": 0.01, "loss/entropy": 0.69, "reward/batch_abs_max": 1.0,
        "actor_restarts": 0, "env_errors": 0, "updates_skipped": 0,
    }
    record.update(changes)
    return record


def run_of(length: int = 40, **changes) -> list[dict]:
    return [healthy(i, **changes) for i in range(length)]


def test_a_healthy_run_has_no_findings():
    assert diagnose(run_of(), CONFIG) == []


def fired(records, config=CONFIG, **kwargs):
    return {finding.rule: finding for finding in diagnose(records, config, **kwargs)}


@pytest.mark.parametrize("rule, records, flag", [
    ("learner_starved", run_of(**{"time/learner_wait_fraction": 0.8}), "--num-actors"),
    ("actors_blocked", run_of(policy_lag_mean=25.0, **{"time/actor_wait_fraction": 0.7,
                                                        "time/learner_wait_fraction": 0.0}), "--device cuda"),
    ("policy_lag_high", run_of(policy_lag_mean=25.0, **{"vtrace/rho_extreme_fraction": 0.1}), "--max-policy-lag 20"),
    ("importance_weights_exploding", run_of(**{"vtrace/rho_extreme_fraction": 0.3}), "--clip-rho-threshold"),
    ("rewards_unclipped", run_of(**{"reward/batch_abs_max": 200.0}), "--reward-clip abs_one"),
    ("throughput_below_env_speed", run_of(env_steps_per_s=2_000.0), "--envs-per-actor"),
    ("torso_layer_dead", run_of(**{"torso/dead_units_first_layer": 1.0, "torso/dead_units_worst_layer": 1.0}),
     "--rmsprop-eps"),
])
def test_rule_fires_on_its_symptom(rule, records, flag):
    finding = fired(records)[rule]
    assert flag in finding.change and any(ch.isdigit() for ch in finding.seen)
    assert finding.why and finding.text().startswith(f"[{rule}]")


def test_impact_importance_weights_use_its_truncation_statistic():
    records = [{**r, "impact/is_weight_clipped_fraction": 0.5} for r in run_of()]
    for r in records:
        del r["vtrace/rho_extreme_fraction"]
    assert "importance_weights_exploding" in fired(records, dataclasses.replace(CONFIG, algo="impact"))


def test_blocked_actors_are_not_a_finding_while_their_unrolls_are_fresh():
    # README's own CartPole run: IMPACT's learner is the bottleneck at a lag of about 10.
    records = run_of(policy_lag_mean=10.0, **{"time/actor_wait_fraction": 0.4, "time/learner_wait_fraction": 0.05})
    assert "actors_blocked" not in fired(records)


def test_lag_alone_is_not_a_finding_while_the_policies_agree():
    assert "policy_lag_high" not in fired(run_of(policy_lag_mean=25.0))


def test_ppo_actors_waiting_for_weights_is_not_a_finding():
    records = run_of(**{"time/actor_wait_fraction": 0.9, "time/learner_wait_fraction": 0.0})
    assert "actors_blocked" not in fired(records, dataclasses.replace(CONFIG, algo="ppo"))


def test_entropy_collapsing_early():
    records = run_of(length=10)
    records[-1]["loss/entropy"] = 0.01
    assert "entropy_collapsed_early" in fired(records)
    late = run_of(length=40)  # 400k of 1M steps: past the first quarter, a low entropy is no alarm
    late[-1]["loss/entropy"] = 0.01
    assert "entropy_collapsed_early" not in fired(late)


def test_returns_flat_for_long_unless_solved():
    records = run_of(length=40)
    for r in records[10:]:
        r["episode_return_mean"] = 100.0
    finding = fired(records)["returns_flat"]
    assert "--unroll-length 40" in finding.change
    assert "returns_flat" not in fired(records, reward_threshold=95.0)
    assert "returns_flat" not in fired(run_of(length=40))  # still improving


def test_returns_of_a_few_games_a_line_are_not_read_as_flat():
    # Pong's lines hold a few games each: three lines of won games (21) halfway through cannot be
    # beaten later, while the means of 100 games rise from -20 to 18.
    streaks = {250, 251, 252, 390, 391, 392}
    records = [healthy(i, episodes=2, episode_return_std=0.0,
                       episode_return_mean=21.0 if i in streaks else -20 + 38 * i / 399) for i in range(400)]
    assert "returns_flat" not in fired(records)


def test_returns_that_rose_and_fell_back_unless_by_noise_or_solved():
    def run(returns, std=10.0):  # 50 episodes a line: a block of 100 episodes is two lines
        return [healthy(i, episode_return_mean=value, episode_return_std=std, episodes=50)
                for i, value in enumerate(returns)]
    rise = [10.0 + 10 * i for i in range(20)]  # blocks of 15, 35, ... 195
    finding = fired(run(rise + [120.0] * 4))["returns_fell"]
    assert "from 15.00 to 195.00 (the 100 episodes to 200,000 env steps) and fell back to 120.00" in finding.seen
    assert "--clip-rho-threshold" in finding.change and "--unrolls-per-batch" in finding.change
    assert "returns_fell" not in fired(run(rise + [120.0] * 4), reward_threshold=100.0)
    ppo = fired(run(rise + [120.0] * 4), dataclasses.replace(CONFIG, algo="ppo"))["returns_fell"]
    assert "--clip-param" in ppo.change and "--unrolls-per-batch" not in ppo.change
    impact = fired(run(rise + [120.0] * 4), dataclasses.replace(CONFIG, algo="impact"))["returns_fell"]
    assert "--clip-param" in impact.change and "--buffer-uses" in impact.change and "--clip-rho" not in impact.change
    assert "returns_fell" not in fired(run(rise + [160.0] * 4))  # less than a quarter of the rise
    # Blocks of 80, then 110 and 90 in turn, then 80: a fall of 30 from a rise of 30, which is
    # a finding where a game's return varies by 5 and noise where it varies by 60.
    wavy = [80.0] * 2 + [110.0, 110.0, 90.0, 90.0] * 10 + [80.0] * 2
    assert "returns_fell" in fired(run(wavy, std=5.0))
    assert "returns_fell" not in fired(run(wavy, std=60.0))
    assert "returns_fell" not in fired(run([50.0] * 20, std=0.0))
    assert "returns_fell" not in fired(run(rise + [120.0] * 4), dataclasses.replace(CONFIG, env="minatar"))


def test_counters_that_grow_are_findings():
    records = run_of()
    records[-1].update(updates_skipped=3, actor_restarts=2, env_errors=7)
    found = fired(records)
    assert "3 learner updates" in found["non_finite_updates"].seen
    assert "2 actor restarts and 7 env errors" in found["actors_restarting"].seen


def test_a_layer_dead_on_some_batches_only_is_not_a_finding():
    records = run_of(**{"torso/dead_units_first_layer": 0.94, "torso/dead_units_worst_layer": 1.0})
    records[-3]["torso/dead_units_worst_layer"] = 0.97  # one unit fired on that batch: not dead
    assert "torso_layer_dead" not in fired(records)
    adam = fired(run_of(**{"torso/dead_units_worst_layer": 1.0}), dataclasses.replace(CONFIG, optimizer="adam"))
    assert "--rmsprop-eps" not in adam["torso_layer_dead"].change


def test_rewards_already_clipped_are_not_a_finding():
    records = run_of(**{"reward/batch_abs_max": 200.0})
    assert "rewards_unclipped" not in fired(records, dataclasses.replace(CONFIG, reward_clip="abs_one"))


def test_episodes_that_never_end_are_a_finding():
    endless = dataclasses.replace(CONFIG, env="oddenvs:Endless-v0")  # no time limit: 100,000 steps count as never
    records = run_of(length=100, episodes=0, episode_return_mean=None)  # 8 envs, 10,000 steps a line
    finding = fired(records, endless)["episodes_not_ending"]
    assert finding.seen == ("no episode ended in the last 990,000 env steps (123,750 per env; oddenvs:Endless-v0 has "
                            "no time limit, and 100,000 steps is eval's cap)")
    assert "--max-episode-steps N" in finding.change and "TimeLimit" in finding.change
    assert "episodes_not_ending" not in fired(records[:80], endless)  # 98,750 per env: not yet
    records[-2].update(episodes=1)
    assert "episodes_not_ending" not in fired(records, endless)
    # CartPole's episodes last at most 500 steps: a line of 1,250 steps per env without one is a finding.
    cartpole = run_of()
    cartpole[-1].update(episodes=0)
    assert "an episode of CartPole-v1 lasts at most 500 steps" in fired(cartpole)["episodes_not_ending"].seen


def test_diagnose_skips_metrics_lines_without_steps_or_time(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(to_yaml(CONFIG))
    lines = ["{}", *map(json.dumps, run_of()), '{"env_steps": 5}', "[1, 2]", '{"wall_time_s": null}', "{}"]
    (run_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    with pytest.raises(SystemExit) as exit_:
        main(["diagnose", str(run_dir)])
    out, err = capsys.readouterr()
    assert exit_.value.code == 0 and err == ""
    assert out.splitlines()[0].endswith("400,000 env steps in 200 s (40 metrics lines, 5 more without env_steps and "
                                        "wall_time_s skipped)")
    assert "nothing to report" in out
    (run_dir / "metrics.jsonl").write_text("{}\n{}\n")
    with pytest.raises(SystemExit) as exit_:
        main(["diagnose", str(run_dir)])
    assert exit_.value.code == 2 and capsys.readouterr().err.splitlines() == [
        f"impactrl diagnose: error: {run_dir}/metrics.jsonl holds no metrics lines with env_steps and wall_time_s"]


def test_every_rule_has_a_test_here():
    tested = {"learner_starved", "actors_blocked", "policy_lag_high", "importance_weights_exploding",
              "rewards_unclipped", "throughput_below_env_speed", "entropy_collapsed_early", "returns_flat",
              "returns_fell", "non_finite_updates", "actors_restarting", "torso_layer_dead", "episodes_not_ending"}
    assert set(RULES) == tested


def test_live_checks_wait_for_the_warm_up_and_do_not_repeat():
    live = LiveDiagnostics(CONFIG, reward_threshold=None)
    starved = run_of(length=200, **{"time/learner_wait_fraction": 0.9})
    reports = {r["wall_time_s"]: live.check(r) for r in starved}
    times = [t for t, found in reports.items() if found]
    assert times[0] >= WARMUP_S and times[1] - times[0] >= REPEAT_S


@pytest.mark.slow
def test_diagnose_names_the_starved_learner_of_a_real_run(run_dir):
    # One env feeding batches of 8 unrolls: the learner waits for data nearly all the time.
    run_cli("train", "--env", "CartPole-v1", "--num-actors", "1", "--envs-per-actor", "1", "--unrolls-per-batch", "8",
            "--total-env-steps", "20000", "--log-interval-s", "1", "--out", str(run_dir), check=True)
    result = run_cli("diagnose", str(run_dir), check=True)
    assert "[learner_starved] the learner waited for data" in result.stdout and "--num-actors" in result.stdout
    assert "[actors_blocked]" not in result.stdout


@pytest.mark.slow
def test_diagnose_names_the_blocked_actors_of_a_real_run(run_dir):
    # IMPACT taking 20 SGD steps on every batch: the actors wait for free slots.
    run_cli("train", "--algo", "impact", "--env", "CartPole-v1", "--num-actors", "1", "--buffer-uses", "20",
            "--total-env-steps", "60000", "--log-interval-s", "1", "--out", str(run_dir), check=True)
    result = run_cli("diagnose", str(run_dir), check=True)
    assert "[actors_blocked] the actors waited for a free slot" in result.stdout, result.stdout
    assert "[learner_starved]" not in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("env", ["ALE/Pong-v5", "MinAtar/Breakout-v1"])
def test_diagnose_reads_a_run_on_env_ids_registered_by_other_packages(run_dir, env):
    # A fresh process that never made an env must still find the ALE and MinAtar ids.
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(dataclasses.replace(CONFIG, env=env)))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in run_of()))
    result = run_cli("diagnose", str(run_dir), check=True)
    assert f"impala on {env}" in result.stdout and "nothing to report" in result.stdout


@pytest.mark.slow
def test_max_policy_lag_drops_and_counts_stale_unrolls(run_dir):
    run_cli("train", "--env", "CartPole-v1", *FAST, "--max-policy-lag", "1", "--total-env-steps", "20000",
            "--out", str(run_dir), check=True)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["unrolls_dropped"] > 0 and records[-1]["env_steps"] >= 20000
    assert all(r["policy_lag_max"] <= 1 for r in records if r["policy_lag_max"] is not None)
