"""Values made from weights (merged projections' concatenation, a contraction's packed panel),
shared by every program that makes them from the same weights the same way, while one lives.

Why: torch.compile compiles a program per cache length and per prompt length, and each made its
own copy: 57 MB of concatenated q/k/v and gate/up weights per TinyLlama layer in bf16, 88 MB of
packed panels. A value is found by what makes it (`how`, hashable) and where its sources lie
(storage, offset, shape, strides, dtype), and only while those storages are the same objects at
the same versions (a weight updated in place is made again); held weakly, it goes with its last
user.
"""
from __future__ import annotations

import weakref

import torch

_MADE: dict[tuple, tuple] = {}   # key -> (weak refs to the sources' storages, versions, the value's)


def _key(how, sources) -> tuple:
    return (how, *((id(t.untyped_storage()), t.storage_offset(), t.shape, t.stride(), t.dtype)
                   for t in sources))


def shared(how, sources: list[torch.Tensor]) -> torch.Tensor | None:
    """The value made `how` from `sources` as they are now, if a live program holds one."""
    refs, versions, value = _MADE.get(_key(how, sources), ((), None, lambda: None))
    if versions != [t._version for t in sources] or not all(
            r() is t.untyped_storage() for r, t in zip(refs, sources)):   # one object per storage
        return None
    return value()


def share(how, sources: list[torch.Tensor], value: torch.Tensor) -> torch.Tensor:
    """Offer `value`, made `how` from `sources` as they are now, to later programs; returns it."""
    key = _key(how, sources)
    _MADE[key] = (tuple(weakref.ref(t.untyped_storage()) for t in sources),
                  [t._version for t in sources], weakref.ref(value, lambda _: _MADE.pop(key, None)))
    return value
