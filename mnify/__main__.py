"""``python -m mnify``: the same as the ``mnify`` console script."""

from mnify.cli import main

main()
