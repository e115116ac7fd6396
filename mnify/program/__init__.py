"""The model of the program being linted or converted, below lint, the hazards and the
rewrites (docs/design.md §1).

``facts``: one walk's table of calls, assignments, blocks and imports (what the rewrites plan
from); ``context``, ``flow`` and ``meaning``: where lint's walk is and what names mean there
(what the hazards detect from); ``noqa``: the suppressions; ``project``: what the files of one
program do with each other's code (helpers wrapped where they are called, models converted
where they are built, trainers distributed at run time).
"""
