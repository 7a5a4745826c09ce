"""The bottom layer: what every other layer may use and that uses none of them. Hashing, paths and the store's
layout, atomic writes, disk-full handling, credentials kept in the process, cell names, answer normalization and
scoring, dataset and corpus file reading, crash points, child processes, progress reporting.

The layers, bottom first (tests/test_architecture.py holds them): core, engines, strategies, schemas, tracking,
tasks, flows, ragledger (the command line). A package imports only itself and the packages below it.
"""

__version__ = "0.1.0"
