"""What impactrl's learner costs on top of the bare PyTorch work it does, per SGD step.

    python benchmarks/learner_overhead.py --env CartPole-v1 --algo impala --steps 300

Times, on one fixed batch of the preset's shape, in this process, alternating in rounds so a
noisy machine slows both alike:

- ``bare``: the agent's forward pass, the log-probs, time-limit bootstrapping, V-trace as a plain
  backward loop, the IMPALA loss, backward, gradient-norm clip and the optimiser step, written
  out as a bare PyTorch loop;
- ``learner``: ``Learner.add`` + ``Learner.update`` (the algorithm's loss with its input checks
  and statistics, learning-rate schedule, ``after_update``);
- ``publish``: copying the weights into the shared block the actors read (once per update).

Prints one JSON line with the milliseconds per step and the ratios learner/bare and
(learner + publish)/bare. The throughput issue's target is learner/bare <= 1.10.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from impactrl.algos import make_algorithm
from impactrl.build import make_agent, rollout_spec, run_tasks
from impactrl.cli import resolve_train_config
from impactrl.data.rollout import Batch, SlotStore
from impactrl.models.heads import CategoricalHead
from impactrl.runtime.learner import Learner
from impactrl.runtime.local import SharedWeights


def random_batch(config, agent, tasks) -> Batch:
    """One batch of the preset's shapes and dtypes with random contents: for timing only."""
    spec = rollout_spec(config, agent, tasks)
    observation_space = tasks.observation_space
    store = SlotStore(spec, config.slots_per_batch, shared=False)
    generator = torch.Generator().manual_seed(0)
    for key, tensor in store.data.items():
        if key == "obs":
            low = torch.as_tensor(observation_space.low).clamp(min=-3.0).float()
            high = torch.as_tensor(observation_space.high).clamp(max=3.0).float()
            sample = low + (high - low) * torch.rand(tensor.shape, generator=generator)
            tensor.copy_(sample.to(tensor.dtype))
        elif key in ("action", "prev_action"):
            tensor.copy_(torch.randint(0, agent.policy_head.num_actions, tensor.shape, generator=generator))
        elif key == "behaviour_log_prob":
            tensor.fill_(-0.7)
        elif key in ("first", "terminated", "truncated"):
            tensor.copy_(torch.rand(tensor.shape, generator=generator) < 0.01)
        elif tensor.dtype.is_floating_point:
            tensor.copy_(torch.randn(tensor.shape, generator=generator))
        else:
            tensor.zero_()
    batch, _ = store.assemble(list(range(config.slots_per_batch)))
    batch["episode_return"].fill_(float("nan"))
    return batch


def bare_step(agent, optimizer, batch: Batch, config) -> None:
    """IMPALA's update written out by hand: what any PyTorch user would write for one batch."""
    from impactrl.models import AgentInput
    from impactrl.data.rollout import core_state

    output, _ = agent(AgentInput(batch["obs"], batch["prev_action"], batch["prev_reward"], batch["first"]),
                      core_state(batch))
    logits, values = output.policy[:-1], output.value
    log_prob = torch.log_softmax(logits, -1).gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        rhos = (log_prob - batch["behaviour_log_prob"]).exp()
        clipped_rhos, cs = rhos.clamp(max=1.0), rhos.clamp(max=1.0)
        # A time-limit cut bootstraps from the actor's value of the real final observation.
        ended = batch["terminated"] | batch["truncated"]
        rewards = batch["reward"] + config.discount * torch.where(
            batch["truncated"] & ~batch["terminated"], batch["truncation_value"], 0.0)
        discounts = config.discount * (~ended).float()
        v = values.detach()
        deltas = clipped_rhos * (rewards + discounts * v[1:] - v[:-1])
        acc = torch.zeros_like(v[-1])
        corrections = []
        for t in reversed(range(deltas.shape[0])):
            acc = deltas[t] + discounts[t] * cs[t] * acc
            corrections.append(acc)
        vs = v[:-1] + torch.stack(corrections[::-1])
        vs_next = torch.cat([vs[1:], v[-1:]])
        advantages = clipped_rhos * (rewards + discounts * vs_next - v[:-1])
    entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    loss = (-(log_prob * advantages).sum() + config.baseline_cost * 0.5 * (vs - values[:-1]).pow(2).sum()
            - config.entropy_cost * entropy.sum())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(agent.parameters(), config.grad_norm_clip, foreach=True)
    optimizer.step()


def learner_benchmark_parser(description: str, env: str, steps: int) -> argparse.ArgumentParser:
    """The options every learner-step benchmark here takes."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default=env)
    parser.add_argument("--algo", default="impala")
    parser.add_argument("--steps", type=int, default=steps, help="SGD steps per variant")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (the learner's share of the cores)")
    return parser


def main() -> None:
    parser = learner_benchmark_parser(__doc__, "CartPole-v1", 300)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = resolve_train_config(["--algo", args.algo, "--env", args.env, "--no-lr-decay"]).config
    tasks = run_tasks(config)
    torch.manual_seed(0)
    learner_agent = make_agent(config, tasks)
    if not isinstance(learner_agent.policy_head, CategoricalHead):
        parser.error("the bare loop is written for discrete actions; pick an env with a Discrete action space")
    bare_agent = make_agent(config, tasks)
    bare_agent.load_state_dict(learner_agent.state_dict())
    batch = random_batch(config, learner_agent, tasks)

    learner = Learner(config, learner_agent, make_algorithm(config, learner_agent), torch.device("cpu"))
    bare_optimizer = type(learner.optimizer)(bare_agent.parameters(), **learner.optimizer.defaults)
    weights = SharedWeights(learner_agent, torch.multiprocessing.get_context("spawn"))

    def learner_step() -> None:
        if learner.algorithm.wants_data():
            learner.add(batch)
        learner.update()

    variants = {"bare": lambda: bare_step(bare_agent, bare_optimizer, batch, config),
                "learner": learner_step,
                "publish": lambda: weights.publish(learner_agent, 0)}
    seconds = dict.fromkeys(variants, 0.0)
    for step in range(args.steps + 20):
        for name, run in variants.items():
            began = time.perf_counter()
            run()
            if step >= 20:  # warm-up
                seconds[name] += time.perf_counter() - began
    ms = {name: 1000 * s / args.steps for name, s in seconds.items()}
    print(json.dumps({"env": args.env, "algo": args.algo, "batch_unrolls": config.slots_per_batch * config.envs_per_actor,
                      "unroll_length": config.unroll_length, **{f"{k}_ms": round(v, 3) for k, v in ms.items()},
                      "learner_over_bare": round(ms["learner"] / ms["bare"], 3),
                      "learner_and_publish_over_bare": round((ms["learner"] + ms["publish"]) / ms["bare"], 3)}))


if __name__ == "__main__":
    main()
