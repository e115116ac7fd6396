"""``mnify run --verify``: prove on the user's own run, in a few updates, that it is data-parallel.

:func:`start` (called by the bootstrap under ``mnify run --verify``, and by
``create_communicator`` when ``MNIFY_VERIFY=K`` is set under a plain ``mpiexec``) watches the
first K updates of every optimizer through :mod:`mnify.runtime.update_watch`, then stops every
rank after the same update. Each rank records, for the checks of docs/verify.md:

- ``same-data``: a fingerprint of every example reaching the model (:mod:`.examples`), and at
  the stop the fingerprints of the dataset or array they were drawn from;
- ``params-differ``: a digest of every parameter after each update (:mod:`.params`);
- ``unwrapped-optimizer``: a plain Chainer optimizer updating while a communicator exists;
- ``rank-writes``: files a rank other than 0 writes (:mod:`.rank_writes`);
- information: the batch reaching the model, iterations per epoch, learning rates.

At the stop rank 0 collects the records (point-to-point on a communicator of its own, with a
deadline, so a rank that never gets there ends the job with a message instead of a hang),
judges them (:mod:`.judge`), prints the verdict block (:mod:`.report`; under ``mnify run`` one
JSON line the launcher renders) and every rank exits 1 with findings, 0 without. Nothing of
this is imported or installed when verification is off.
"""

from __future__ import annotations

from mnify import environment

DEFAULT_UPDATES = 3  # K of ``mnify run --verify`` without ``--verify-updates``


def requested_updates() -> int | None:
    """K from ``MNIFY_VERIFY`` (``1``..), None when verification is off."""
    value = environment.VERIFY.read()
    return None if value == 0 else max(1, value)


def start_if_requested() -> bool:
    """Start verification when ``MNIFY_VERIFY`` asks for it; True if it runs."""
    updates = requested_updates()
    if updates is None:
        return False
    from mnify.runtime.verify.session import start

    start(updates)
    return True
