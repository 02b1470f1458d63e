"""Kernel IR (`ir.py`), its lowering from Tile IR (`lower*.py`), the per-thread loops of the CPU
(`thread_loops.py`) and the simulator (`sim*.py`)."""
