# Command-line overrides in nanoGPT's configurator style (written for these tests): `--key=value` sets a
# module-level setting of train.py, the value read as a Python literal and of the same type as the default.
import sys
from ast import literal_eval

for arg in sys.argv[1:]:
    assert arg.startswith("--") and "=" in arg, f"expected --key=value, got {arg!r}"
    key, value = arg[2:].split("=", 1)
    assert key in globals(), f"unknown setting {key}"
    try:
        parsed = literal_eval(value)
    except (SyntaxError, ValueError):
        parsed = value
    assert type(parsed) is type(globals()[key]), f"{key}: {parsed!r} is not a {type(globals()[key]).__name__}"
    globals()[key] = parsed
