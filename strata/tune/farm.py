"""`strata tune ... --ray ADDRESS`: the kernels of a program searched on every node of a Ray
cluster at once, each node timing on its own hardware.

Why Ray: a farm of machines is what `strata machine`'s profiles are keyed for, and a model's
kernels are independent searches. One actor per live node (pinned to it) runs the measuring
process of search.py there, prepares the program itself (compiled for that node's CPU) and takes
kernels from a queue until none is left; nodes of one class (the tuning database's target key:
CPU, cores, ISA features) share the queue, and each class searches every kernel, so every class
gets its own winners. Results come back to this process, which alone writes the database. A node
that dies mid-search gives its kernel back to the queue; the search goes on on the others.
`--ray local` starts a cluster on this machine. Ray is an extra: pip install -e ".[ray]".
"""
from __future__ import annotations

import os
import socket
import time
from collections import deque

from ..core.errors import DeviceUnavailable, StrataError
from .db import TuningDB, compiler_version


def connect(address: str):
    """ray, initialised against `address` ("local": a cluster of this machine's cores)."""
    try:
        import ray
    except ImportError:
        raise DeviceUnavailable('--ray needs Ray, which is not installed: pip install -e ".[ray]" '
                                '(or pip install ray)') from None
    if not ray.is_initialized():
        if address not in ("local", "auto"):
            _answers(address)
        try:
            ray.init(address=None if address == "local" else address, include_dashboard=False,
                     logging_level="ERROR", log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise StrataError(f"--ray {address}: no Ray cluster answers there ({e})") from None
    return ray


def _answers(address: str) -> None:
    """One sentence when nothing listens at host:port (Ray itself would retry for ever)."""
    host, colon, port = address.split("://")[-1].rpartition(":")
    if not colon:                       # a host alone: Ray's default port (its client's: 10001)
        host, port = port, "10001" if "://" in address else "6379"
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as e:
        raise StrataError(f"--ray {address}: no Ray cluster answers there "
                          f"({getattr(e, 'strerror', None) or e}); give its head's host:port, "
                          f"or local") from None


class Node:
    """What runs in a Ray actor on one node: search.py's measuring process, and the searches."""

    def __init__(self, prepare: dict, command: list[str] | None):
        from .search import WorkerProcess      # (numpy, through the cost model: not at `--help`)
        self.worker = WorkerProcess(prepare, command)

    def start(self) -> dict:
        info = self.worker.start()
        info.update(host=socket.gethostname(), version=compiler_version())
        return info

    def search(self, k: dict, seconds: float, cores: int):
        from .search import tune_loaded
        return tune_loaded(self.worker, k, time.monotonic() + seconds, lambda text: None, cores)

    def ask(self, req: dict) -> dict:
        return self.worker.ask(req)

    def close(self) -> None:
        self.worker.close()


class Farm:
    """One Node actor on each live node of the cluster, started and prepared."""

    def __init__(self, address: str, prepare: dict, command: list[str] | None, say):
        ray = self.ray = connect(address)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        remote = ray.remote(max_restarts=0)(Node)
        nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU")]
        say(f"preparing the program on {len(nodes)} Ray node{'s' * (len(nodes) != 1)}")
        # each takes all of its node's CPUs: nothing else of Ray's runs beside its timings, and
        # Ray's OMP_NUM_THREADS for it is every core
        actors = [remote.options(num_cpus=n["Resources"]["CPU"],
                                 scheduling_strategy=NodeAffinitySchedulingStrategy(
                                     n["NodeID"], soft=False)).remote(prepare, command)
                  for n in nodes]
        version = compiler_version()
        self.classes: dict[str, tuple[dict, list]] = {}   # target key -> (an info, its actors)
        for actor, info in zip(actors, ray.get([a.start.remote() for a in actors])):
            if "error" in info:
                raise RuntimeError(f"{info.get('host', 'a Ray node')}: {info['why']}")
            if info["version"] != version:
                raise StrataError(f"Ray node {info['host']} runs strata {info['version']}, this "
                                  f"machine {version}: install the same strata on every node")
            self.classes.setdefault(info["target"], (info, []))[1].append(actor)

    def search(self, actors: list, todo: list[tuple[dict, float]], cores: int, say):
        """Yield each kernel's KernelResult as a node finishes it; `todo`: (kernel, seconds). A
        node that dies is taken out of `actors`."""
        ray, pending, running, idle = self.ray, deque(todo), {}, list(actors)
        while pending or running:
            while pending and idle:
                actor, (k, seconds) = idle.pop(), pending.popleft()
                running[actor.search.remote(k, seconds, cores)] = (actor, (k, seconds))
            (ref,), _ = ray.wait(list(running), num_returns=1)
            actor, job = running.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayActorError:
                say(f"a Ray node died searching {job[0]['name']}: it goes to another")
                pending.appendleft(job)
                actors.remove(actor)            # (the class's list: the program is timed on one alive)
                if not idle and not running:
                    raise RuntimeError("every Ray node of this class died") from None
                continue
            idle.append(actor)
            yield result

    def close(self) -> None:
        for _, actors in self.classes.values():
            for a in actors:
                try:
                    self.ray.get(a.close.remote(), timeout=30)
                except Exception:  # noqa: BLE001 - a dead node has nothing to close
                    pass
                self.ray.kill(a)


def tune_on_farm(address: str, prepare: dict, budget_s: float, db: TuningDB, force: bool, say,
                 command, go_on: bool):
    """search.tune_program on a Ray cluster: each class of nodes searches every kernel, each
    kernel with its share of the budget (so N nodes of a class take about 1/N of its time); the
    results of every class, the target and program times of the first."""
    from .search import finish, keep, plan
    farm = Farm(address, prepare, command, say)
    try:
        answers = []
        for target, (info, actors) in farm.classes.items():
            results, todo = plan(info, prepare, db, force, go_on)
            total = sum(k.get("ms", 0.0) for k in todo)
            jobs = [(k, budget_s * (k["ms"] / total if total and "ms" in k else 1 / len(todo)))
                    for k in todo]
            for n, r in enumerate(farm.search(actors, jobs, info.get("cores", 1 << 10), say), 1):
                say(f"{n}/{len(jobs)} kernels searched on {len(actors)} node"
                    f"{'s' * (len(actors) != 1)} of {target.split(':')[0]}")
                results.append(keep(db, target, r))
            ask = lambda req, a=actors[0]: farm.ray.get(a.ask.remote(req))   # noqa: E731
            answers.append(finish(ask, info, results, db, say, bool(todo)))
        results = [r for rs, _, _ in answers for r in rs]
        return results, answers[0][1], answers[0][2]
    finally:
        farm.close()
