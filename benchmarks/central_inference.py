"""Actor-side inference (impactrl's layout) against SEED-style central inference, measured with
env stepping and the policy's forward pass only (no learner, no unrolls), on this machine:

    python benchmarks/central_inference.py --env ALE/Pong-v5 --seconds 20

- actor-side: P processes; each steps its E envs and runs the policy on their E observations.
- central:    P env processes step E envs each and write the observations to shared memory; one
              inference process waits for all of them, runs the policy once on the P·E
              observations, writes the actions back and wakes them (pipes for the signals).

Both use impactrl's envs (``make_env_vector``) and the agent its preset builds for the env, one
intra-op thread per process. Prints one JSON line per layout.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import torch.multiprocessing as mp

from impactrl.build import make_agent, make_training_envs, run_tasks
from impactrl.cli import resolve_train_config
from impactrl.models import AgentInput

WARMUP_S = 3.0


def policy_actions(agent, obs: np.ndarray) -> np.ndarray:
    """The actor's forward pass for feed-forward agents: sample an action per observation."""
    E = obs.shape[0]
    head = agent.policy_head
    inputs = AgentInput(
        obs=torch.from_numpy(obs)[None],
        prev_action=torch.zeros((1, E, *head.action_shape), dtype=head.action_dtype),
        prev_reward=torch.zeros(1, E),
        first=torch.zeros(1, E, dtype=torch.bool),
    )
    output, _ = agent(inputs, ())
    action, _ = head.sample_with_log_prob(output.policy[0])
    return action.numpy()


def actor_side_worker(config, index: int, seconds: float, result) -> None:
    torch.set_num_threads(1)
    tasks = run_tasks(config)
    envs = make_training_envs(config, tasks, index, seed=100 * index)
    obs = envs.reset()
    agent = make_agent(config, tasks).eval()
    steps, began, deadline = 0, None, time.perf_counter() + WARMUP_S + seconds
    with torch.inference_mode():
        while (now := time.perf_counter()) < deadline:
            if began is None and now >= deadline - seconds:
                began, steps = now, 0
            obs = envs.step(policy_actions(agent, obs)).obs
            steps += config.envs_per_actor
    result[index] = steps / (time.perf_counter() - began)


def env_worker(config, index: int, obs_buffer: torch.Tensor, action_buffer: torch.Tensor, conn) -> None:
    torch.set_num_threads(1)
    envs = make_training_envs(config, run_tasks(config), index, seed=100 * index)
    obs_buffer[index] = torch.from_numpy(envs.reset())
    conn.send_bytes(b"o")
    while conn.recv_bytes() == b"a":
        obs_buffer[index] = torch.from_numpy(envs.step(action_buffer[index].numpy()).obs)
        conn.send_bytes(b"o")
    envs.close()


def run_central(config, processes: int, seconds: float, context) -> float:
    torch.set_num_threads(1)
    E = config.envs_per_actor
    tasks = run_tasks(config)
    agent = make_agent(config, tasks).eval()
    obs_buffer = torch.zeros((processes, E, *tasks.observation_space.shape),
                             dtype=torch.from_numpy(tasks.observation_space.sample()).dtype).share_memory_()
    head = agent.policy_head
    action_buffer = torch.zeros((processes, E, *head.action_shape), dtype=head.action_dtype).share_memory_()
    pipes = [context.Pipe() for _ in range(processes)]
    workers = [context.Process(target=env_worker, args=(config, i, obs_buffer, action_buffer, child))
               for i, (_, child) in enumerate(pipes)]
    for worker in workers:
        worker.start()
    ends = [parent for parent, _ in pipes]
    steps, began, deadline = 0, None, None
    with torch.inference_mode():
        while True:
            for end in ends:  # a lockstep batch: every env process has sent its observations
                end.recv_bytes()
            now = time.perf_counter()
            if deadline is None:  # the first observations: the env processes are up
                deadline = now + WARMUP_S + seconds
            if began is None and now >= deadline - seconds:
                began, steps = now, 0
            if now >= deadline:
                break
            actions = policy_actions(agent, obs_buffer.flatten(0, 1).numpy())
            action_buffer.copy_(torch.from_numpy(actions).view_as(action_buffer))
            for end in ends:
                end.send_bytes(b"a")
            steps += processes * E
    rate = steps / (time.perf_counter() - began)
    for end in ends:
        end.send_bytes(b"q")
    for worker in workers:
        worker.join()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--processes", type=int, default=2, help="actor (or env) processes")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--env-backend", default="gymnasium", choices=["gymnasium", "envpool"])
    args = parser.parse_args()
    config = resolve_train_config(["--env", args.env, "--env-backend", args.env_backend]).config
    context = mp.get_context("spawn")
    result = context.Array("d", args.processes)
    workers = [context.Process(target=actor_side_worker, args=(config, i, args.seconds, result))
               for i in range(args.processes)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    common = {"env": args.env, "env_backend": args.env_backend, "processes": args.processes,
              "envs_per_process": config.envs_per_actor}
    print(json.dumps({"layout": "actor-side", **common, "env_steps_per_s": sum(result)}), flush=True)
    rate = run_central(config, args.processes, args.seconds, context)
    print(json.dumps({"layout": "central", **common, "env_steps_per_s": rate}), flush=True)


if __name__ == "__main__":
    main()
