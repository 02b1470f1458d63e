"""Run in each Ray worker process of tests/tune/test_farm.py's cluster (Ray's
worker_process_setup_hook): the nodes' load reads as quiet there, as search.OtherLoad does in
the tests' own process (test_tune.QuietMachine), so that a test beside others still stores."""


class Quiet:
    def __init__(self, pids=()):
        pass

    def share(self):
        return 0.0


def quiet() -> None:
    import strata.tune.search
    strata.tune.search.OtherLoad = Quiet
