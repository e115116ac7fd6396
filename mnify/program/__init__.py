"""The model of the program being linted or converted, below both (docs/design.md §1).

``project``: what the files of one program do with each other's code (helpers wrapped where
they are called, models converted where they are built, trainers distributed at run time).
"""
