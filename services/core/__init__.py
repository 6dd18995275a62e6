"""Pure domain: standard library only, no I/O, no clock, no logging (tests/unit/test_architecture.py enforces it)."""
