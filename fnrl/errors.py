"""The errors fnrl explains in one line.

`ConfigError` means "the user asked for something that cannot work": the command line catches
it, prints its one-line message and exits with code 2, before any training starts.
`SamplerError` means a sampler's process or worker failed mid-run: the training loops turn it
into a one-line `TrainingError` naming the env step and the last checkpoint.
"""


class ConfigError(ValueError):
    """A bad env id, option, algorithm/space mismatch or checkpoint, explained in one line."""


class SamplerError(RuntimeError):
    """A sampler's process or worker died, failed or stopped answering (`--sampler async`'s
    process, a `--sampler parallel` worker), in one line; the sampler is closed."""
