"""The Ray runtime: actors are Ray actors anywhere on a Ray cluster, the learner is this process.

Data flow (the only channels there are)::

    actor i: run_actor on a thread of a Ray actor writes each unroll into its one preallocated
             slot; commit copies it out and queues it; at most ``in_flight`` copies not yet
             taken, then the loop waits for the learner (backpressure)
    learner -> actor i: take(start, weights, limit)   one call out per actor, once
             ``take_at_least`` (about half) of its ``in_flight`` share is free: the learner
             holds only the rest in unrolls of that actor it has not trained on yet; ``limit``
             is the room left, so a learner that falls behind gets several unrolls per call
    actor i -> learner: the reply to a take: every unroll queued by then (at least one, at most
             ``limit``), each with its UnrollRecord, inside the call's answer up to 16 MiB
             (cluster.REPLY_INLINE_BYTES; larger ones through the object store, owned by the
             learner); the learner copies each once, into the batch being filled
    learner -> actors: the weights, at most once per publication (at most every
             ``publish_interval`` updates; PPO's every one) and only when a take carries
             them, ride on take calls: the take fetches them, and an actor loads the newest
             one it has at its next unroll boundary. PPO's actors, whose takes are all out while
             they wait for a publication, pull it from a WeightsBoard the learner posts to
             once. Inline when small, else ray.put once and passed by reference (a node
             fetches it once); optionally as deltas (``weight_delta``). A publication costs
             the learner the same whatever the number of actors.

So memory is bounded whatever the speed ratio: per actor at most ``in_flight`` unrolls queued
in the actor, and ``in_flight`` in its reply and the learner's batches together.

Faults are Ray's to repair: actors are created with ``max_restarts=-1``, so Ray restarts a
killed worker (or an actor whose node left the cluster, on a node that has room) in a fresh
process. The learner sees the take calls fail, sends new ones (they wait for the restart), and
the new process starts its loop with the start arguments and the newest weights its first take
carries; its reply says it is fresh, which is counted in ``actor_restarts`` against the same
budget as the local runtime (``max_actor_restarts`` per ``actor_restart_window_s``). An actor loop
that raises is killed so that Ray restarts it, except on EnvBroken, which stops the run.
Actors are owned by this process: Ray stops them when it exits, however it exits.

The package by role: ``codec`` (weights as messages and deltas), ``cluster`` (joining or starting
Ray, preflight, run_info.json, a test cluster), ``actor_side`` (the Ray actor), ``learner_side``
(the learner's BatchSource and WeightSink, ``run``). Only ``cluster`` imports without Ray
installed, so that preflight can say how to install it.
"""

from impactrl.runtime.ray.cluster import connect, preflight, ray, two_node_cluster, write_run_info

if ray is not None:
    from impactrl.runtime.ray.actor_side import (ObjectStoreWeightSource, RayActor, StartArgs, TakeReply,
                                                 WeightsBoard)
    from impactrl.runtime.ray.codec import (WeightsMessage, apply_delta, delta_bound, delta_bytes,
                                            encode_delta)
    from impactrl.runtime.ray.learner_side import ObjectStoreWeightSink, RayActors, run, unrolls_in_flight

__all__ = ["ObjectStoreWeightSink", "ObjectStoreWeightSource", "RayActor", "RayActors", "StartArgs", "TakeReply",
           "WeightsBoard", "WeightsMessage", "apply_delta", "connect", "delta_bound", "delta_bytes", "encode_delta",
           "preflight", "run", "two_node_cluster", "unrolls_in_flight", "write_run_info"]
