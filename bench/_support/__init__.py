"""What only the benchmarks need, kept out of the runtime: bench-only variants of its classes
(:mod:`_support.spinning`).

Benchmarks import it as ``_support`` (each puts ``bench/`` on ``sys.path``, as for
``allreduce``). What they share with the tests (launching ranks, the multi-host test bed, the
corpus) is in ``testkit/``; nothing in ``bench/`` imports ``tests``
(tests/test_package_layout.py).
"""
