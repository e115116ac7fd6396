"""What the benchmarks share and the runtime and the tests should not carry for them: launching
ranks on this machine, the bench-only communicator variants, the corpus loader.

Benchmarks import it as ``_support`` (each puts ``bench/`` on ``sys.path``, as for
``allreduce``). Nothing in ``bench/`` imports ``tests`` (tests/test_package_layout.py).
"""
