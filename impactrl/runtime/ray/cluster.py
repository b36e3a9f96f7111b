"""Ray itself: joining a cluster or starting a local instance, the checks before a run starts,
where things run (``run_info.json``), and a two-node cluster on one machine for tests."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

from impactrl.config import TrainConfig, learner_resources, ray_actor_resources
from impactrl.errors import UserError

try:
    import ray
    import colorama  # noqa: I001  after ray, which ships its own copy on the path
except ImportError:  # the optional extra ray: preflight says how to install it
    ray = None


@contextlib.contextmanager
def two_node_cluster(node_cpus: int) -> Iterator[str]:
    """The address of a Ray cluster of two nodes simulated on this machine, each promising
    ``node_cpus`` CPUs and an object store of 2 GiB, shut down afterwards: the multi-node path
    without a second machine. A real node's store is 30% of its memory; Ray's test default of
    150 MiB spilled replies to disk from 64 simulated Pong actors on (benchmarks/README.md)."""
    from ray.cluster_utils import Cluster

    node = {"num_cpus": node_cpus, "object_store_memory": 2 * 2**30}
    cluster = Cluster(initialize_head=True, head_node_args=node)
    try:
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


# A reply up to this size travels inside the call's answer, straight from the actor to the learner;
# Ray's default (100 KiB) sends every unroll through the object store: a put, a pin and a free
# in the raylet per reply (benchmarks/README.md, "Replies inside the call"). Larger ones still go there.
REPLY_INLINE_BYTES = 16 * 2**20


def worker_env(niceness: int) -> dict:
    """The runtime_env of a Ray actor or learner: its process runs at ``niceness`` above the
    node's Ray processes (Ray's default, +15 for its own servers' sake, leaves a worker almost no
    CPU beside any other busy process: learners run at 0, actors at --actor-niceness), and returns
    replies of up to REPLY_INLINE_BYTES inside the call, on any cluster."""
    return {"env_vars": {"RAY_worker_niceness": str(niceness),
                         "RAY_max_direct_call_object_size": str(REPLY_INLINE_BYTES)}}


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def where_am_i() -> dict:
    return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}


def write_run_info(path: Path, config: TrainConfig, learner: dict, actors: list,
                   weights: dict | None = None) -> None:
    """``path`` (``RUN_DIR/run_info.json``; learner r > 0's ``run_info.learner-r.json``): where the
    learner and every process of every actor ran (newest last); at the end also what the weight
    broadcasts cost."""
    info = {"runtime": "ray", "ray_address": config.ray_address, "learner": learner,
            "actors": {str(actor.actor_id): actor.incarnations for actor in actors},
            # an actor whose newest process ended (lost with its node, killed) waits for Ray to restart it
            "running": {str(actor.actor_id): bool(actor.incarnations) and "ended_at" not in actor.incarnations[-1]
                        for actor in actors},
            **({"weights": weights} if weights is not None else {})}
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(info, indent=1))
    partial.replace(path)


def preflight(config: TrainConfig) -> None:
    """Before anything starts: Ray is installed, the cluster answers and can hold the actors."""
    if ray is None:
        raise UserError('--runtime ray needs Ray: pip install -e ".[ray]" (or pip install "ray>=2.60")')
    need = {"CPU": config.ray_actor_cpus, **ray_actor_resources(config)}
    if config.ray_address is None:
        custom = sorted(name for name in need if name != "CPU")
        if custom:
            raise UserError(f"--ray-actor-resources {', '.join(custom)}: a local Ray instance has no such resource; "
                            "join a cluster whose nodes offer it with --ray-address")
        check_local_learner_resources(config)
        return
    join(config.ray_address)
    nodes, capacity, asked = actor_capacity(config)
    if capacity < config.num_actors:
        ray.shutdown()
        raise UserError(f"--ray-address {config.ray_address}: the cluster's {nodes} node(s) can hold {capacity} "
                        f"actor(s) asking for {asked} each, not --num-actors {config.num_actors}; lower "
                        "--ray-actor-cpus or --num-actors, or add nodes")
    others = config.num_learners - 1
    nodes, capacity, asked = room_for(learner_resources(config), others)
    if capacity < others:
        ray.shutdown()
        raise UserError(f"--ray-address {config.ray_address}: the cluster's {nodes} node(s) can hold {capacity} "
                        f"learner(s) asking for {asked} each, not the {others} besides learner 0 of --num-learners "
                        f"{config.num_learners}; change --learner-resources or add nodes")


def check_local_learner_resources(config: TrainConfig) -> None:
    """A local instance offers this machine's CPUs and GPUs only."""
    import torch

    asked = learner_resources(config)
    custom = sorted(name for name, amount in asked.items() if name not in ("CPU", "GPU") and amount > 0)
    if custom:
        raise UserError(f"--learner-resources {', '.join(custom)}: a local Ray instance has no such resource; "
                        "join a cluster whose nodes offer it with --ray-address")
    gpus = asked.get("GPU", 0.0) * (config.num_learners - 1)
    if gpus > torch.cuda.device_count():
        raise UserError(f"--learner-resources GPU={asked['GPU']:g} for {config.num_learners - 1} learner(s) needs "
                        f"{gpus:g} GPUs; PyTorch sees {torch.cuda.device_count()} here")


def actor_capacity(config: TrainConfig) -> tuple[int, int, str]:
    """The cluster's live nodes, how many actors their resources hold and what each asks for."""
    return room_for({"CPU": config.ray_actor_cpus, **ray_actor_resources(config)}, config.num_actors)


def room_for(need: dict[str, float], wanted: int) -> tuple[int, int, str]:
    """The cluster's live nodes, how many processes asking for ``need`` their resources hold
    (counted per node from its totals; ``wanted`` per node if they ask for nothing) and the ask in words."""
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    capacity = sum(min((math.floor(node.get(name, 0.0) / amount + 1e-9) for name, amount in need.items() if amount > 0),
                       default=wanted) for node in nodes)
    return len(nodes), capacity, ", ".join(f"{name}={amount:g}" for name, amount in need.items())


def cluster_room(config: TrainConfig) -> str:
    """Why actors may wait for Ray to restart them, in words (for the stall line)."""
    nodes, capacity, asked = actor_capacity(config)
    if capacity < config.num_actors:
        return (f"no node has room for them (the cluster's {nodes} node(s) can hold {capacity} of the "
                f"{config.num_actors} actors, asking for {asked} each; add a node or lower --ray-actor-cpus)")
    return f"the cluster's {nodes} node(s) can hold all {config.num_actors} actors (asking for {asked} each)"


def join(address: str) -> None:
    """Join the Ray cluster at ``address`` (HOST:PORT or auto); one line when nothing answers there."""
    if address != "auto":
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=5.0).close()
        except OSError as error:
            raise UserError(f"--ray-address {address}: nothing answers there ({error.strerror or error}); "
                            "start the head with `ray start --head` and pass the address it prints") from None
    plain_output()
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, ValueError, RuntimeError) as error:
        raise UserError(f"--ray-address {address}: cannot join the Ray cluster: {first_line(error)}") from None


def connect(config: TrainConfig) -> None:
    """Join the cluster (preflight may have already), or start a local instance sized for the run:
    its CPU count is a scheduling promise, so actors may outnumber cores as in the local runtime."""
    if ray.is_initialized():
        return
    plain_output()
    if config.ray_address is not None:
        ray.init(address=config.ray_address, logging_level=logging.WARNING)
        return
    learners = (config.num_learners - 1) * learner_resources(config)["CPU"]  # learner 0 is this process
    cpus = max(os.cpu_count() or 1, math.ceil(config.num_actors * config.ray_actor_cpus + learners))
    reap_with_this_process()
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING)


def plain_output() -> None:
    """Ray colours the lines it relays from the cluster: the "(raylet)" prefixes and, whatever
    RAY_COLOR_PREFIX says, its "[repeated 2x across cluster]" suffix. Not into a file or a pipe, nor
    under NO_COLOR: such a stream of this process is wrapped, once, in colorama's code stripper."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, colorama.ansitowin32.StreamWrapper):
            continue
        if os.environ.get("NO_COLOR") or not stream.isatty():
            setattr(sys, name, colorama.AnsiToWin32(stream, convert=False, strip=True).stream)


INSTANCE_VARIABLE = "IMPACTRL_RAY_INSTANCE"
REAPER = Path(__file__).with_name("reaper.py")
_reaper_pipe: int | None = None  # the write end: open exactly as long as this process lives
_marker: str | None = None  # what the processes of this process's instances inherit


def reap_with_this_process() -> None:
    """Before starting a local instance: the processes it starts inherit a marker, and a reaper
    (runtime/ray/reaper.py) kills them once this process is gone, even SIGKILLed. So a run stops
    exactly the instance it started (``ray stop`` would stop every instance of the machine). The
    marker is set again for every instance: a run restores the environment it found when it ends."""
    global _reaper_pipe, _marker
    if not Path("/proc").is_dir():
        return
    if _reaper_pipe is None:
        _marker = uuid.uuid4().hex
        read, _reaper_pipe = os.pipe()  # not inherited by the processes Ray starts: only this one holds it
        environment = {key: value for key, value in os.environ.items() if key != INSTANCE_VARIABLE}
        subprocess.Popen([sys.executable, "-I", str(REAPER), f"{INSTANCE_VARIABLE}={_marker}", str(read)],
                         pass_fds=(read,), env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(read)
    os.environ[INSTANCE_VARIABLE] = _marker
