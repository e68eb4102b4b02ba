"""The chat and interleaved routes: request parsing and field rules, the interleaved pipeline's
and text-only chat's routes.
"""
