"""The model of the program being linted or converted, below lint, the hazards and the
rewrites (docs/design.md §1).

``walk``: the one walk of a file that builds its ``FileProgram`` (facts, flow context, the
attached hazards' findings); ``facts``: the table of calls, assignments, blocks, imports,
attribute reads, divisions and iteration units (what the rewrites plan from); ``context``,
``flow`` and ``meaning``: where the walk is and what names mean there (what the hazards detect
from); ``noqa``: the suppressions; ``project``: what the files of one
program do with each other's code (helpers wrapped where they are called, models converted
where they are built, trainers distributed at run time); ``effects`` (with ``effect_summary``
and ``effect_cache``): what each function of the program and of the packages it calls does,
transitively (writes, trains, reads data, changes imports, forks, joins collectives).
"""
