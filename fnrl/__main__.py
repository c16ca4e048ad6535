"""`python -m fnrl ...` is the `fnrl` command (so `torchrun ... -m fnrl train ...` works)."""
import sys

from fnrl.cli import command_line

if __name__ == "__main__":
    sys.exit(command_line())
