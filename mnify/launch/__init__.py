"""Launching a script on N MPI ranks and reading what the ranks print.

``mnify run`` is built from these pieces, one concept a module:

- :mod:`~mnify.launch.mpiexec` finds the ``mpiexec`` to use and tells Open MPI from MPICH;
- :mod:`~mnify.launch.hosts` reads hostfiles, ``--host`` lists and this machine's cores;
- :mod:`~mnify.launch.command` turns a :class:`~mnify.launch.command.LaunchSpec` into the exact
  argv and environment (root, oversubscription, forwarded variables);
- :mod:`~mnify.launch.ranklines` strips the per-rank tags mpiexec puts on output lines;
- :mod:`~mnify.launch.runner` runs the job, streams rank output and stops the job when it must;
- :mod:`~mnify.launch.session` finds and signals every process of the job (mpiexec's session);
- :mod:`~mnify.launch.rank_reports` cuts the ranks' tracebacks and exit lines out of their output;
- :mod:`~mnify.launch.launcher_messages` reads what mpiexec says about ranks and launches;
- :mod:`~mnify.launch.early_exit` notices a rank that left while others wait for it;
- :mod:`~mnify.launch.error_groups` groups identical tracebacks across ranks;
- :mod:`~mnify.launch.diagnosis` decides the category of a failure and its culprit ranks;
- :mod:`~mnify.launch.verdict` says the diagnosis in words and as ``--summary-json`` data.
"""
