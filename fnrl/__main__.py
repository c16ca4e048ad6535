"""`python -m fnrl ...` is the `fnrl` command (so `torchrun ... -m fnrl train ...` works)."""
import sys

from fnrl.cli import main

if __name__ == "__main__":
    sys.exit(main())
