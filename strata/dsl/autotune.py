"""@strata.autotune: pick a kernel's best config by measurement, once per key, remembered.

    @st.autotune(configs=[{"BLOCK": 128}, {"BLOCK": 256}, {"BLOCK": 512}], key=["n"])
    @st.kernel
    def scale_add(x, y, out, n: int, alpha: float, BLOCK: st.constexpr): ...
    scale_add[lambda c: (n + c["BLOCK"] - 1) // c["BLOCK"], lambda c: c["BLOCK"]](x, y, out, n, 2.0)

Why through the tuner's rules rather than a loop of timings: every config is first run once and
its outputs compared with the first config's (a config that differs, or that the simulator finds
racy, is discarded and named: it is a bug in the kernel or in strata), the survivors are timed
interleaved (median of rounds), and the winner is kept in strata's tuning database (SQLite,
tune/db.py) under the kernel's source, the key values, the argument types and the device, so a
later process launches it without measuring. On the simulator nothing is timed (its time says
nothing of hardware): every config is checked and the first is used.
"""
from __future__ import annotations

import hashlib
import inspect
import logging
import statistics
import time

import torch

from ..core.errors import InputMismatch, StrataError
from ..tune.db import default_db
from .kernel import KernelFunction, _device_of

log = logging.getLogger("strata.autotune")
ROUNDS = 7


def autotune(configs, key=(), rounds: int = ROUNDS):
    """Decorate a @strata.kernel (see the module docstring)."""
    configs = [dict(c) for c in configs]
    if not configs:
        raise StrataError("st.autotune needs at least one config")

    def wrap(fn):
        if not isinstance(fn, KernelFunction):
            raise StrataError("st.autotune decorates a @strata.kernel: put it above @st.kernel")
        return AutotunedKernel(fn, configs, tuple(key), rounds)
    return wrap


class AutotunedKernel:
    def __init__(self, fn: KernelFunction, configs: list[dict], key: tuple, rounds: int):
        self.fn, self.configs, self.key, self.rounds = fn, configs, key, rounds
        self.source = inspect.getsource(fn.fn)      # part of every launch's signature
        self.__name__ = fn.__name__
        self.chosen: dict = {}           # signature -> config, in this process
        self.report: list[str] = []      # what the latest search found (discarded configs)

    def __getitem__(self, launch):
        if not (isinstance(launch, tuple) and len(launch) == 2):
            raise InputMismatch(f"launch {self.__name__} as {self.__name__}[grid, block](...), "
                                f"each an int, a tuple or a function of the config")
        return lambda *args, device=None, **kwargs: self.launch(launch, args, kwargs, device)

    def signature(self, args, kwargs, device: str) -> str:
        bound = self.fn.signature.bind_partial(*args, **kwargs).arguments
        for name in self.key:
            if name not in bound:
                raise InputMismatch(f"{self.__name__}: autotune key {name} is not an argument")
        described = {n: (tuple(v.shape), str(v.dtype)) if hasattr(v, "shape") else repr(v)
                     for n, v in bound.items() if n in self.key or hasattr(v, "shape")}
        text = self.source + repr(sorted(described.items())) + device
        return "dsl:" + hashlib.sha256(text.encode()).hexdigest()[:24]

    def launch(self, shape, args, kwargs, device) -> None:
        tensors = [v for v in list(args) + list(kwargs.values()) if hasattr(v, "shape")]
        device = device or _device_of(tensors)
        sig = self.signature(args, kwargs, device)
        config = self.chosen.get(sig)
        if config is None:
            db = default_db()
            config = db.get(sig, device) if db is not None else None
            if config is None:
                config = self.search(shape, args, kwargs, device, sig, db)
            self.chosen[sig] = config
        self.run(shape, config, args, kwargs, device)

    def run(self, shape, config, args, kwargs, device) -> None:
        grid, block = (s(config) if callable(s) else s for s in shape)
        self.fn[grid, block](*args, device=device, **kwargs, **config)

    def search(self, shape, args, kwargs, device, sig, db) -> dict:
        """Check every config against the first, time the survivors, record the winner."""
        tensors = [v for v in list(args) + list(kwargs.values()) if hasattr(v, "shape")]
        saved = [torch.as_tensor(t).clone() for t in tensors]

        def restore():
            for t, s in zip(tensors, saved):
                torch.as_tensor(t).copy_(s)

        def attempt(config):
            restore()
            self.run(shape, config, args, kwargs, device)
            return [torch.as_tensor(t).clone() for t in tensors]
        reference = attempt(self.configs[0])
        ok, self.report = [self.configs[0]], []
        for config in self.configs[1:]:
            try:
                got = attempt(config)
            except StrataError as e:
                self.report.append(f"{config}: {e}")
                continue
            if all(torch.allclose(g.double(), r.double(), rtol=1e-3, atol=1e-5, equal_nan=True)
                   for g, r in zip(got, reference)):
                ok.append(config)
            else:
                self.report.append(f"{config}: its outputs differ from {self.configs[0]}'s")
        for line in self.report:
            log.warning("autotune %s: discarded %s", self.__name__, line)
        if device == "sim":
            restore()
            return self.configs[0]
        times = {i: [] for i in range(len(ok))}
        for _ in range(self.rounds):
            for i, config in enumerate(ok):
                start = time.perf_counter()
                self.run(shape, config, args, kwargs, device)
                times[i].append(time.perf_counter() - start)
        ms = {i: statistics.median(t) * 1e3 for i, t in times.items()}
        best = min(ms, key=ms.get)
        restore()
        log.info("autotune %s on %s: %s (%.4f ms; %d configs, %d discarded; first config %.4f ms)",
                 self.__name__, device, ok[best], ms[best], len(self.configs), len(self.report),
                 ms[0])
        if db is not None:
            db.put(sig, device, ok[best], f"@strata.kernel {self.__name__}", ms[0], ms[best],
                   len(self.configs), self.report)
        return ok[best]
