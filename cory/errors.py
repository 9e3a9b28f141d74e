"""The errors whose message is written for the user: one line each, printed as `error: ...` with exit code 2.

They live here, below every other module, so that any layer can raise them without importing the layer that
reports them (`cory.train`).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid configuration; the message is one line naming the key, its value and what is allowed."""


class AssetUnavailableError(RuntimeError):
    """A model, tokenizer or dataset could not be found locally and the Hub cannot provide it."""


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, corrupt or from an incompatible run."""


class NonFiniteError(RuntimeError):
    """Training diverged: too many consecutive non-finite iterations, or weights that turned non-finite."""


# What the entry points print as one `error:` line (exit code 2) instead of a traceback.
USER_ERRORS = (ConfigError, AssetUnavailableError, CheckpointError, NonFiniteError)


def one_line(err: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(str(err).split()) or type(err).__name__
