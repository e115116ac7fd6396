"""One module per hazard: ``mnNNN_<rule_name>.py`` holds the MN code, its name, why it breaks,
a bad and a good example, its detection (the rule class's visitor methods, run in lint's single
walk) and, where ``mnify convert`` fixes it, the fix or the name of the converter step that
fixes it (docs/rules.md, docs/converter.md).

Adding a hazard is one module here, one fixture (fixtures/lint/MNNNN.py) and nothing else:
:mod:`mnify.hazards.registry` finds the module. Other modules of this package are helpers shared
by several hazards, named for what they hold.
"""
