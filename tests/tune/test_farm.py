"""`strata tune --ray` (strata/tune/farm.py): the same search spread over the nodes of a Ray
cluster, here two nodes on the loopback address, with a measuring process whose times are made
up (so the winners are known): the database gets the rows a local tune writes, and a node killed
mid-search gives its kernel to the other."""
import json
import sys
import textwrap
from pathlib import Path

import pytest

from strata.cli import main
from strata.tune.db import TuningDB
from strata.tune.farm import tune_on_farm
from strata.tune.search import tune_program

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e \".[ray]\")")

# three kernels; TILE_N=8 is the fastest schedule of each. With KILL set, the first process to
# be asked for a candidate kills the Ray worker it runs under (its parent), once.
MADE_UP = textwrap.dedent("""
    import json, os, sys, time
    KILL = {kill!r}
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "prepare":
            reply = {{"target": "fake", "cores": 2, "kernels": [
                {{"name": f"k{{i}}", "signature": f"s{{i}}", "label": f"k{{i}}[4]",
                  "knobs": {{"TILE_N": 32}}, "ms": 1.0 + i}} for i in range(3)]}}
        elif req["op"] == "estimate":
            reply = {{"ms": [1.0] * len(req["candidates"])}}
        else:
            try:                    # O_EXCL: of two nodes asked at once, one kills (once)
                os.close(os.open(KILL, os.O_CREAT | os.O_EXCL)) if KILL else None
                os.kill(os.getppid(), 9) if KILL else None
            except FileExistsError:
                pass
            fast = all(p.get("TILE_N") == 8 for p in req["kernel_knobs"].values())
            time.sleep(0.2)         # a window long enough for the node's load to be read
            reply = {{"ms": 1.0 if fast else 2.0, "default_ms": 2.0, "same": False}}
        print(json.dumps(reply), flush=True)
""")


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture
def connected(cluster):
    """This process connected to the cluster, its nodes' load read as quiet (ray_quiet.py: the
    tests beside this one must not make a node drop what it measured)."""
    ray.shutdown()
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).parent)},
                          "worker_process_setup_hook": "ray_quiet.quiet"})
    yield cluster.address
    ray.shutdown()


@pytest.fixture(autouse=True)
def _values(monkeypatch):
    sys.path.insert(0, str(Path(__file__).parent))
    from ray_quiet import Quiet
    monkeypatch.setattr("strata.tune.search.OtherLoad", Quiet)
    monkeypatch.setattr("strata.tune.search.VALUES", {"TILE_N": (8, 16, 64)})


def _rows(db: TuningDB) -> set:
    return {(r["signature"], r["target"], r["knobs"], r["stopped"]) for r in db.rows()}


def _made_up(kill: str = "") -> list[str]:
    return [sys.executable, "-c", MADE_UP.format(kill=kill)]


@pytest.mark.slow
def test_a_tune_on_two_ray_nodes_writes_the_rows_a_local_one_does(connected, tmp_path):
    local, farmed = TuningDB(tmp_path / "local.sqlite"), TuningDB(tmp_path / "farm.sqlite")
    tune_program({"op": "prepare"}, 60, local, command=_made_up())
    results, target, times = tune_on_farm(connected, {"op": "prepare"}, 60, farmed, False,
                                          lambda text: None, _made_up(), False)
    assert _rows(farmed) == _rows(local)
    assert {(s, json.loads(k)) == (s, {"TILE_N": 8}) for s, _, k, _ in _rows(farmed)} == {True}
    assert len(results) == 3 and target == "fake" and times == (2.0, 1.0)


@pytest.mark.slow
def test_a_ray_node_killed_mid_search_gives_its_kernel_to_the_other(connected, tmp_path):
    local, farmed = TuningDB(tmp_path / "local.sqlite"), TuningDB(tmp_path / "farm.sqlite")
    tune_program({"op": "prepare"}, 60, local, command=_made_up())
    said = []
    tune_on_farm(connected, {"op": "prepare"}, 60, farmed, False, said.append,
                 _made_up(str(tmp_path / "killed")), False)
    assert (tmp_path / "killed").exists() and any("a Ray node died" in s for s in said)
    assert _rows(farmed) == _rows(local)


def test_ray_at_an_address_where_none_answers_is_one_sentence(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path))
    ray.shutdown()                      # (a test before may have connected this process)
    assert main(["tune", "-c", "torch.randn(8) * 2", "--ray", "127.0.0.1:1"]) != 0
    assert "--ray 127.0.0.1:1: no Ray cluster answers there" in capsys.readouterr().err


def test_ray_missing_is_one_sentence(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, "ray", None)           # import ray fails
    assert main(["tune", "-c", "torch.randn(8) * 2", "--ray", "local"]) != 0
    assert 'pip install -e ".[ray]"' in capsys.readouterr().err
