"""The rule classes, one module per family (MN1xx device, MN2xx fork, MN3xx collectives,
MN4xx extensions, MN5xx data-parallel completeness, MN9xx information)."""
