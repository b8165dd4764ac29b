"""A module that compiled code in tests/test_guards.py imports inside its body (issue 40 item 3)."""

factor = 2.0
