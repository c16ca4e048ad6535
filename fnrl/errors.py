"""The one error type that means "the user asked for something that cannot work".

The command line catches it, prints its one-line message and exits with code 2,
before any training starts.
"""


class ConfigError(ValueError):
    """A bad env id, option, algorithm/space mismatch or checkpoint, explained in one line."""
