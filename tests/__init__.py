"""Tests of mnify: a package, so an installed top-level ``tests`` package cannot shadow it."""
