"""Launching a script on N MPI ranks and reading what the ranks print.

``mnify run`` is built from these pieces, one concept a module:

- :mod:`~mnify.launch.mpiexec` finds the ``mpiexec`` to use and tells Open MPI from MPICH;
- :mod:`~mnify.launch.hosts` reads hostfiles, ``--host`` lists and this machine's cores;
- :mod:`~mnify.launch.command` turns a :class:`~mnify.launch.command.LaunchSpec` into the exact
  argv and environment (root, oversubscription, forwarded variables);
- :mod:`~mnify.launch.ranklines` strips the per-rank tags mpiexec puts on output lines;
- :mod:`~mnify.launch.runner` runs the job, streams rank output and keeps tracebacks aside;
- :mod:`~mnify.launch.rank_reports` cuts the ranks' tracebacks out of their output;
- :mod:`~mnify.launch.launcher_messages` reads mpiexec's reports of how ranks ended;
- :mod:`~mnify.launch.failures` groups identical tracebacks and says what kind of failure it is;
- :mod:`~mnify.launch.verdict` prints the summary.
"""
