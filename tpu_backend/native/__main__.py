"""`python -m tpu_backend.native build`: compile the extension (tools/setup.sh runs it with
TPU_NATIVE=0, so that importing the package does not warn that it is not built yet)."""

import sys

from tpu_backend.native import build

if sys.argv[1:] != ["build"]:
    print("usage: python -m tpu_backend.native build", file=sys.stderr)
    sys.exit(2)
try:
    print(build())
except RuntimeError as error:
    print(f"tpu_backend.native: {error}\n(the device still works through the pure-Python path)", file=sys.stderr)
    sys.exit(1)
