"""Kernel IR, its lowering from Tile IR, and the simulator.

This package is also `@strata.kernel`, the decorator of hand-written kernels (dsl/kernel.py):
the name `strata.kernel` is this package once any of it is imported, so the package is made
callable rather than one name meaning two things depending on import order."""
import sys
import types


class _KernelPackage(types.ModuleType):
    def __call__(self, fn=None):
        from ..dsl.kernel import kernel
        return kernel(fn)


sys.modules[__name__].__class__ = _KernelPackage
