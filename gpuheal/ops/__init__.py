"""Operator tools: `gpuheal status | maintenance | gate | doctor | audit`.

Each command reads the cluster through one blocking client, works out its
answer with pure functions (gpuheal.policy.pools, gpuheal.policy.gate), and
prints a Report (ops/output.py) as a table, JSON or YAML.
"""
