"""What the tests, the benchmarks and the scripts share, outside ``tests/`` so that ``bench/`` and
``scripts/`` never import the test suite (tests/test_package_layout.py checks it).

- :mod:`testkit.ranks`: run a script on N ranks of this machine (``mnify run``'s mpiexec,
  oversubscribed, root allowed), with every rank's output.
- :mod:`testkit.testbed`: several hosts on one machine (network namespaces, docs/testbed.md).
- :mod:`testkit.corpus`: the corpus of training scripts under ``fixtures/corpus/scripts``.
- :mod:`testkit.skeletons` and :mod:`testkit.properties`: the generator of Chainer scripts and
  the properties every conversion must keep (tests/convert/test_properties.py runs them at the
  CI budget, scripts/hypothesis_long.py at a long one).

Not part of the installed package (``pyproject.toml`` packages ``mnify`` only).
"""
