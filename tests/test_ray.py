"""The Ray runtime on real Ray: a local instance the CLI starts, and a multi-node cluster on this
machine (``ray.cluster_utils.Cluster``) that the CLI joins. Actors are really killed and nodes
really removed."""

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import FAST, actor_niceness, run_cli
from test_learning import best_of_two_seeds
from test_faults import run_faulty
from test_runtime import CONTRACT_KEYS, read_metrics

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from impactrl.config import TrainConfig  # noqa: E402
from impactrl.runtime.ray import (ObjectStoreWeightSink, ObjectStoreWeightSource, RayActor, StartArgs,  # noqa: E402
                                  WeightsBoard, apply_delta, delta_bytes, encode_delta)
from impactrl.runtime.ray.cluster import worker_env  # noqa: E402
from impactrl.runtime.ray.learner_side import take_at_least, unrolls_in_flight  # noqa: E402
from impactrl.runtime.synthetic import Synthetic  # noqa: E402
from impactrl.training import build_learner  # noqa: E402

pytestmark = pytest.mark.slow  # each test starts a Ray instance or cluster


@contextlib.contextmanager
def no_process_left_behind():
    """Mark every process started inside the block (the CLI, the Ray servers and workers it
    starts inherit the environment) and assert that none is left when it ends."""
    marker = f"IMPACTRL_TEST_RAY_RUN={uuid.uuid4().hex}".encode()
    os.environ["IMPACTRL_TEST_RAY_RUN"] = marker.split(b"=")[1].decode()
    try:
        yield
    finally:
        del os.environ["IMPACTRL_TEST_RAY_RUN"]
    deadline = time.monotonic() + 30
    while (left := processes_marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes left running: {left}"


def processes_marked(marker: bytes) -> dict[int, str]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ")[:100].decode()
            except OSError:
                continue
    return found


def run_info(run_dir: Path) -> dict:
    return json.loads((run_dir / "run_info.json").read_text())


def wait_until_training(run_dir: Path, process: subprocess.Popen) -> dict:
    """run_info once every actor has delivered an unroll and the learner has trained on one."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        try:
            info, records = run_info(run_dir), read_metrics(run_dir)
        except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or a line half-written
            info, records = None, []
        if info and all(info["actors"].values()) and records and records[-1]["learner_updates"] > 0:
            return info
        time.sleep(0.2)
    process.kill()
    raise AssertionError(f"training did not start: {process.communicate()[1][-2000:]}")


def current_nodes(info: dict) -> dict[str, str]:
    """Actor id -> the node its newest process runs on."""
    return {actor: incarnations[-1]["node_id"] for actor, incarnations in info["actors"].items() if incarnations}


def test_ray_runtime_trains_with_the_same_outputs_and_leaves_no_ray_process(run_dir: Path):
    with no_process_left_behind():
        # IMPACT taking every ready batch: the learner polls the actors between SGD steps.
        run_cli("train", "--runtime", "ray", "--env", "CartPole-v1", "--algo", "impact", "--buffer-fetch", "ready",
                "--total-env-steps", "4000", "--out", str(run_dir), *FAST, check=True)
    records = read_metrics(run_dir)
    assert records and all(CONTRACT_KEYS <= set(record) for record in records)
    assert records[-1]["env_steps"] >= 4000 and records[-1]["actor_restarts"] == 0
    assert records[-1]["learner_updates"] >= records[-1]["env_steps"] // (8 * 20)  # a step per batch taken
    assert any(record["episode_return_mean"] is not None for record in records)
    assert (run_dir / "checkpoints" / "latest.pt").resolve().is_file()
    info = run_info(run_dir)
    assert info["learner"]["pid"] > 0 and sorted(info["actors"]) == ["0", "1"]
    result = run_cli("eval", str(run_dir), "--episodes", "2", check=True)
    assert json.loads(result.stdout.splitlines()[-1])["episodes"] == 2


def test_ppo_gets_every_version_it_waits_for_also_as_deltas(run_dir: Path):
    """Synchronous: each batch is acted with the weights trained on the one before, so the lag is 0,
    also when the weights travel as lossless deltas (each actor rebuilds every publication)."""
    run_cli("train", "--runtime", "ray", "--algo", "ppo", "--env", "CartPole-v1", "--total-env-steps", "6000",
            "--num-actors", "2", "--envs-per-actor", "4", "--unrolls-per-batch", "8", "--unroll-length", "32",
            "--num-minibatches", "4", "--update-epochs", "2", "--log-interval-s", "0.5", "--out", str(run_dir),
            "--weight-delta", "lossless", check=True)
    records = read_metrics(run_dir)
    assert records[-1]["env_steps"] >= 6000
    assert all(record["policy_lag_max"] in (None, 0) for record in records)
    weights = run_info(run_dir)["weights"]
    assert weights["publications"] >= 6000 // 256 and weights["bytes_per_delta"] < weights["bytes_full_copy"]


@pytest.mark.parametrize("bound", [None, 1e-3])
def test_weight_deltas_rebuild_the_learners_weights_exactly_or_within_the_bound(bound):
    """A chain of real updates: what actors rebuild from deltas is the learner's weights (lossless)
    or within the bound, which does not grow along the chain (each delta is against the rebuilt copy)."""
    config = TrainConfig(env="MinAtar/Breakout-v1", learning_rate=0.01, optimizer="adam")
    agent = build_learner(config, None)[0].agent
    optimizer = torch.optim.Adam(agent.parameters(), lr=0.01)
    held = {key: value.clone() for key, value in agent.state_dict().items()}
    for _ in range(20):
        optimizer.zero_grad()
        sum(parameter.square().sum() for parameter in agent.parameters()).backward()
        optimizer.step()
        new = {key: value.detach().clone() for key, value in agent.state_dict().items()}
        delta = encode_delta(new, held, bound)
        held = apply_delta(held, delta, bound)
        assert delta_bytes(delta) < sum(value.nbytes for value in new.values())
        for key, value in new.items():
            if bound is None:
                assert torch.equal(held[key], value)
            else:  # the bound, plus float32 rounding of the weight
                assert (held[key] - value).abs().max() <= bound * (1 + 1e-3) + 1e-6 * value.abs().max()


def test_a_restarted_ray_actor_acts_with_the_newest_weights_and_ppo_pulls_them_from_the_board():
    """Nothing is pushed to actors: a (re)started actor's first take carries the newest weights,
    and a synchronous actor whose takes are all out pulls a new publication from the board."""
    config = TrainConfig(env="CartPole-v1", algo="ppo", num_actors=1, envs_per_actor=2, unroll_length=5)
    learner, spec = build_learner(config, None)
    sink = ObjectStoreWeightSink(config)
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        board = ray.remote(WeightsBoard).options(num_cpus=0).remote()
        actor = ray.remote(RayActor).options(num_cpus=0, max_restarts=-1, max_concurrency=4).remote(
            config, [0], spec, 1, board)
        start = StartArgs(generation=0, reward_stats=None)
        sink.publish(learner.agent, 7)
        reply = ray.get(actor.take.remote(0, start, sink.latest(), 1), timeout=120)
        assert [record.policy_version for _, record, _ in reply.unrolls] == [7]
        # Its loop now waits for a publication newer than 7, and no take is out: the board brings it.
        pending = actor.take.remote(0, start, sink.latest(), 1)
        sink.publish(learner.agent, 8)
        board.post.remote(sink.latest())
        assert ray.get(pending, timeout=120).unrolls[-1][1].policy_version == 8
        os.kill(reply.where["pid"], signal.SIGKILL)
        sink.publish(learner.agent, 12)
        newest = sink.latest()
        board.post.remote(newest)
        deadline = time.monotonic() + 120
        while True:  # the calls fail until Ray has restarted the process
            try:
                reply = ray.get(actor.take.remote(0, StartArgs(1, None), newest, 1), timeout=120)
                break
            except ray.exceptions.RayActorError:
                assert time.monotonic() < deadline
                time.sleep(0.5)
        assert reply.where is not None and reply.unrolls[0][1].policy_version == 12
    finally:
        ray.shutdown()


def test_an_actor_keeps_the_weights_a_take_brings_not_their_object_refs():
    """A reference kept past the take that brought it makes the actor's process a borrower, which
    costs RPCs with the learner for every publication: the weight source fetches the parts at
    once, and a chain of lossless deltas still rebuilds the learner's weights bit for bit."""
    config = TrainConfig(env="MinAtar/Breakout-v1", weight_delta="lossless")
    learner = build_learner(config, None)[0]
    optimizer = torch.optim.SGD(learner.agent.parameters(), lr=0.1)
    sink, source = ObjectStoreWeightSink(config), ObjectStoreWeightSource(None)
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        for version in range(3):
            optimizer.zero_grad()
            sum(parameter.square().sum() for parameter in learner.agent.parameters()).backward()
            optimizer.step()
            sink.publish(learner.agent, version)
            message = sink.latest()
            assert any(isinstance(part, ray.ObjectRef) for part in message.parts)  # MinAtar's are put
            source.receive(message)
            assert not any(isinstance(part, ray.ObjectRef) for part in source._latest.parts)
        assert len(message.parts) == 3  # a full copy and two deltas
        actor_agent = build_learner(config, None)[0].agent
        assert source.load_into(actor_agent) == (2, 3)
        for key, value in learner.agent.state_dict().items():
            assert torch.equal(actor_agent.state_dict()[key], value)
    finally:
        ray.shutdown()


def test_a_reply_carries_the_queued_unrolls_whole_in_order_and_at_most_its_limit():
    """Simulated actors replay 4 recorded unrolls in turn into an outbox of 4: once it is full, a
    take gets what is queued, oldest first, never more than its limit, each unroll intact."""
    config = TrainConfig(env="CartPole-v1", algo="impala", num_actors=1, envs_per_actor=2, unroll_length=5)
    learner, spec = build_learner(config, None)
    sink = ObjectStoreWeightSink(config)
    sink.publish(learner.agent, 3)
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        actor = ray.remote(RayActor).options(num_cpus=0, max_concurrency=4).remote(
            config, [0], spec, 4, None, Synthetic(actors_per_process=1, recorded_unrolls=4))
        start = StartArgs(generation=0, reward_stats=None)

        def take(limit: int) -> list:
            time.sleep(2.0)  # the replay refills the outbox in well under a second
            return ray.get(actor.take.remote(0, start, sink.latest(), limit), timeout=120).unrolls

        first = ray.get(actor.take.remote(0, start, sink.latest(), 1), timeout=120).unrolls  # recorded 0
        middle, last = take(3), take(8)  # recorded 1, 2, 3; then 0, 1, 2, 3 (the outbox holds 4)
        assert [len(first), len(middle), len(last)] == [1, 3, 4]
        times = [created_at for _, _, created_at in first + middle + last]
        assert times == sorted(times)
        assert all(record.policy_version == 3 for _, record, _ in first + middle + last)
        for sent, again in zip(first + middle, last):
            assert sent[0].keys() == again[0].keys() == spec.fields().keys()
            for key, value in sent[0].items():
                assert np.array_equal(value, again[0][key], equal_nan=True)  # episode_return: NaN but at ends
        assert not np.array_equal(first[0][0]["obs"], middle[0][0]["obs"])  # four different unrolls
    finally:
        ray.shutdown()


def test_a_take_waits_for_half_an_actors_share_but_never_holds_every_actor_back_short_of_a_batch():
    """With the default slots a take asks for 2 or more unrolls; with any slots the checks allow,
    every actor held back (more than in_flight - take_at_least of its unrolls in the learner's
    batches) means a whole batch is there to train on."""
    config = TrainConfig(env="CartPole-v1", num_actors=2)
    assert take_at_least(unrolls_in_flight(config), 2, config.slots_per_batch) >= 2
    for actors in range(1, 20):
        for slots_per_batch in range(1, 20):
            for slots in [2 * actors + 2 * slots_per_batch, *range(max(slots_per_batch + 1, actors), 50)]:
                in_flight = math.ceil(slots / actors)
                least = take_at_least(in_flight, actors, slots_per_batch)
                assert 1 <= least <= math.ceil(in_flight / 2)
                assert actors * (in_flight - least + 1) >= slots_per_batch


def test_a_reply_travels_inside_the_call_not_through_the_object_store():
    """Ray puts a return over 100 KiB in the object store (a put, pin and free in the raylet for
    each); the actors' runtime env raises that bound, so a MinAtar unroll of 32 envs (0.3 MB)
    comes inside the call's answer: this checks that the installed Ray still honours the setting."""
    config = TrainConfig(env="MinAtar/Breakout-v1", algo="impala", num_actors=1, envs_per_actor=32)
    learner, spec = build_learner(config, None)
    sink = ObjectStoreWeightSink(config)
    sink.publish(learner.agent, 1)
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        actor = ray.remote(RayActor).options(num_cpus=0, max_concurrency=4, runtime_env=worker_env(0)).remote(
            config, [0], spec, 2, None, Synthetic(actors_per_process=1, recorded_unrolls=2))
        reply = actor.take.remote(0, StartArgs(generation=0, reward_stats=None), sink.latest(), 1)
        (arrays, _, _), = ray.get(reply, timeout=120).unrolls
        assert sum(value.nbytes for value in arrays.values()) > 100 * 1024  # Ray's default bound
        assert ray.experimental.get_object_locations([reply])[reply]["node_ids"] == []  # on no node's store
    finally:
        ray.shutdown()


def test_a_killed_actor_worker_is_restarted_by_ray_and_the_run_finishes(run_dir: Path):
    """One actor, so the run can only finish once Ray has restarted it."""
    process = subprocess.Popen(
        [sys.executable, "-m", "impactrl", "train", "--runtime", "ray", "--env", "CartPole-v1", "--total-env-steps",
         "40000", "--out", str(run_dir), *FAST, "--num-actors", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        victim = wait_until_training(run_dir, process)["actors"]["0"][-1]["pid"]
        # --actor-niceness, not Ray's default +15 for workers, which starves actors beside any busy process.
        assert os.getpriority(os.PRIO_PROCESS, victim) == actor_niceness()
        os.kill(victim, signal.SIGKILL)
        _, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-3000:]
    last = read_metrics(run_dir)[-1]
    assert last["env_steps"] >= 40000 and last["actor_restarts"] >= 1
    assert last["actor"]["0"]["restarts"] == last["actor_restarts"]
    pids = [incarnation["pid"] for incarnation in run_info(run_dir)["actors"]["0"]]
    assert pids[0] == victim and len(set(pids)) == len(pids) >= 2
    assert "Ray restarted it" in stderr


def test_a_hung_actor_is_killed_and_restarted_by_ray(run_dir: Path, tmp_path: Path):
    """One actor, whose env hangs once: the run can only finish once it was found and restarted."""
    markers = tmp_path / "markers"
    markers.mkdir()
    result = run_faulty(run_dir, "HangingCartPole-v0", "--runtime", "ray", "--total-env-steps", "20000",
                        "--num-actors", "1", "--actor-stall-timeout-s", "10", markers=markers)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sent no heartbeat for 10 s (hung)" in result.stderr
    assert read_metrics(run_dir)[-1]["actor_restarts"] == 1


def test_actors_spread_over_a_two_node_cluster_and_come_back_when_a_node_leaves(tmp_path: Path):
    with no_process_left_behind():
        on_a_cluster(tmp_path)


def on_a_cluster(tmp_path: Path) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1, resources={"spare": 1})
        cluster.wait_for_nodes()
        # Each node has room for one actor, so they must land on both. (An actor reports where it
        # runs with its first unroll: the budget leaves the slower-starting one time to deliver.)
        both = tmp_path / "both"
        run_cli("train", "--runtime", "ray", "--ray-address", cluster.address, "--env", "CartPole-v1",
                "--total-env-steps", "20000", "--out", str(both), *FAST, check=True)
        info = run_info(both)
        assert len(set(current_nodes(info).values())) == 2
        assert read_metrics(both)[-1]["env_steps"] >= 20000
        # One more actor than the cluster holds: refused before anything starts.
        result = run_cli("train", "--runtime", "ray", "--ray-address", cluster.address, "--out", str(tmp_path / "no"),
                         *FAST, "--num-actors", "3")
        assert result.returncode == 2 and "can hold 2 actor(s)" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "no").exists()

        # A node leaves mid-run: its actor comes back on the node that has room. The actor needs
        # "spare", which only the workers offer, and is alone, so the run cannot end without it.
        cluster.add_node(num_cpus=1, resources={"spare": 1})
        cluster.wait_for_nodes()
        moved = tmp_path / "moved"
        process = subprocess.Popen(
            [sys.executable, "-m", "impactrl", "train", "--runtime", "ray", "--ray-address", cluster.address,
             "--env", "CartPole-v1", "--total-env-steps", "40000", "--out", str(moved), *FAST, "--num-actors", "1",
             "--ray-actor-resources", "spare=1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = current_nodes(wait_until_training(moved, process))["0"]
            [node] = [node for node in cluster.worker_nodes if node.node_id == first]
            cluster.remove_node(node)
            _, stderr = process.communicate(timeout=300)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == 0, stderr[-3000:]
        assert read_metrics(moved)[-1]["env_steps"] >= 40000 and read_metrics(moved)[-1]["actor_restarts"] >= 1
        nodes = [incarnation["node_id"] for incarnation in run_info(moved)["actors"]["0"]]
        assert nodes[0] == first and nodes[-1] != first and nodes[-1] != cluster.head_node.node_id
        assert cluster.head_node.remaining_processes_alive()  # a joined cluster is left running
    finally:
        cluster.shutdown()


def test_ray_user_errors_are_one_line_before_anything_starts(tmp_path: Path):
    out = tmp_path / "run"
    cases = [
        (["--ray-address", "127.0.0.1:1"], "nothing answers there"),
        (["--ray-address", "head-without-port"], "must be HOST:PORT"),
        (["--ray-actor-resources", "gpu_box=1"], "a local Ray instance has no such resource"),
    ]
    for flags, message in cases:
        result = run_cli("train", "--runtime", "ray", "--out", str(out), *flags)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()
    # Without Ray installed (a module named ray that fails to import, first on the path).
    shadow = tmp_path / "no_ray"
    shadow.mkdir()
    (shadow / "ray.py").write_text("raise ImportError('No module named ray')\n")
    result = run_cli("train", "--runtime", "ray", "--out", str(out), extra_path=str(shadow))
    assert result.returncode == 2 and 'pip install -e ".[ray]"' in result.stderr and not out.exists()


@pytest.mark.slow
def test_cartpole_reaches_450_on_ray(tmp_path: Path):
    with no_process_left_behind():
        best, _ = best_of_two_seeds(tmp_path, 450, "--algo", "impala", "--runtime", "ray", "--env", "CartPole-v1",
                                    "--num-actors", "2", "--total-env-steps", "500000")
    assert best >= 450


def test_a_sigkilled_learner_leaves_no_process_of_the_local_ray_instance_it_started(run_dir: Path):
    """Ray's agents (DashboardAgent, RuntimeEnvAgent) outlived a SIGKILLed driver; nothing of the
    instance may stay, and nothing tells the user to `ray stop` (which stops every instance)."""
    marker = f"IMPACTRL_TEST_RAY_RUN={uuid.uuid4().hex}".encode()
    env = {**os.environ, "IMPACTRL_TEST_RAY_RUN": marker.split(b"=")[1].decode()}
    process = subprocess.Popen(
        [sys.executable, "-m", "impactrl", "train", "--runtime", "ray", "--env", "CartPole-v1", "--total-env-steps",
         "10000000", "--out", str(run_dir), *FAST], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_until_training(run_dir, process)
        assert any("DashboardAgent" in line or "RuntimeEnvAgent" in line or "raylet" in line
                   for line in processes_marked(marker).values())
        process.kill()
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    deadline = time.monotonic() + 60
    while (left := processes_marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:  # so that a failure leaves nothing behind either
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the run's Ray instance left running: {left}"
    assert "ray stop" not in stderr


def test_rays_relayed_lines_carry_no_colour_codes_into_a_file(run_dir: Path, tmp_path: Path):
    """Workers that die make the raylet relay a "(raylet) ..." line, which Ray colours; into a file
    (not a terminal) it comes plain."""
    log = tmp_path / "output.txt"
    with log.open("w") as output:
        subprocess.run([sys.executable, "-m", "impactrl", "train", "--runtime", "ray", "--env",
                        "faultenvs:CrashingCartPole-v0", "--total-env-steps", "4000", "--out", str(run_dir), *FAST],
                       stdout=output, stderr=subprocess.STDOUT, timeout=300, check=True,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)})
    text = log.read_text()
    assert read_metrics(run_dir)[-1]["actor_restarts"] >= 1 and "Ray restarted it" in text
    assert "\x1b[" not in text, [line for line in text.splitlines() if "\x1b[" in line][:3]


def test_plain_output_strips_every_colour_code_from_what_goes_to_a_pipe():
    """Ray's "[repeated 2x across cluster]" suffix is green whatever RAY_COLOR_PREFIX says (the
    raylet test above sees it only when two lines repeat): what a process writes to a pipe after
    plain_output() comes without codes, however often it was called."""
    coloured = "print('\\x1b[33m(raylet)\\x1b[0m died \\x1b[32m [repeated 2x across cluster]\\x1b[0m')"
    written = subprocess.run([sys.executable, "-c", "from impactrl.runtime.ray.cluster import plain_output; "
                              f"plain_output(); {coloured}; plain_output(); {coloured}"],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    assert written == "(raylet) died  [repeated 2x across cluster]\n" * 2


def test_actors_lost_with_a_node_that_no_node_has_room_for_are_reported_counted_and_marked(run_dir: Path,
                                                                                           tmp_path: Path):
    """Each node holds one actor; the worker node leaves with its actor and the head has no room:
    the loss is said in one line when Ray reports it and counted, run_info.json no longer lists the
    actor as running, and after --actor-stall-timeout-s the stall line says no node has room."""
    with no_process_left_behind():
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"spare": 1}})
        try:
            cluster.add_node(num_cpus=1, resources={"spare": 1})
            cluster.wait_for_nodes()
            stderr_path = tmp_path / "stderr.txt"
            with stderr_path.open("w") as stderr:
                process = subprocess.Popen(
                    [sys.executable, "-m", "impactrl", "train", "--runtime", "ray", "--ray-address", cluster.address,
                     "--env", "CartPole-v1", "--total-env-steps", "100000000", "--out", str(run_dir), *FAST,
                     "--ray-actor-resources", "spare=1", "--actor-stall-timeout-s", "10"],
                    stdout=subprocess.DEVNULL, stderr=stderr, text=True)
            try:
                lost_node = {node.node_id: node for node in cluster.worker_nodes}
                nodes = current_nodes(wait_until_training(run_dir, process))
                [lost] = [actor for actor, node in nodes.items() if node in lost_node]
                cluster.remove_node(lost_node[nodes[lost]])
                deadline = time.monotonic() + 180
                while "have waited" not in stderr_path.read_text() and time.monotonic() < deadline:
                    assert process.poll() is None, stderr_path.read_text()[-3000:]
                    time.sleep(0.5)
                text = stderr_path.read_text()
                losses = [line for line in text.splitlines() if f"actor {lost} failed (" in line]
                assert len(losses) == 1 and "Ray brings it back where there is room" in losses[0], text[-3000:]
                [stall] = [line for line in text.splitlines() if "have waited" in line]
                assert f"actors [{int(lost)}] have waited" in stall and "no node has room for them" in stall
                info = run_info(run_dir)
                assert info["running"] == {lost: False, str(1 - int(lost)): True}
                assert "ended_at" in info["actors"][lost][-1] and len(info["actors"][lost]) == 1
                deadline = time.monotonic() + 60
                while read_metrics(run_dir)[-1]["actor_restarts"] < 1 and time.monotonic() < deadline:
                    time.sleep(0.5)
                assert read_metrics(run_dir)[-1]["actor_restarts"] == 1
                assert read_metrics(run_dir)[-1]["actor"][lost]["restarts"] == 1
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=120)
            finally:
                if process.poll() is None:
                    process.kill()
        finally:
            cluster.shutdown()
