"""Rank scripts for the Chainer-facing runtime tests, and the pytest-side helper that runs them."""
