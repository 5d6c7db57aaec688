"""The error types users see. One root carries the exit status; `cli.main` catches it once."""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "EnvbuilderError",
    "HttpNotFound",
    "IndexError_",
    "InputError",
    "MissingToolError",
    "OutputError",
]


class EnvbuilderError(Exception):
    """A failure with a message meant for the user and the exit status to end with."""

    return_code: int = 1

    def __init__(self, message: str, *, return_code: int | None = None) -> None:
        super().__init__(message)
        if return_code is not None:
            self.return_code = return_code


class InputError(EnvbuilderError):
    """Bad input from the user: a file, an argument, a selector. Exit status 2."""

    return_code = 2


class ConfigError(InputError):
    """A configuration file is invalid; the message lists every problem found."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{path}: {len(self.problems)} problem(s):\n{lines}")


class OutputError(EnvbuilderError):
    """An output cannot be written (a read-only or full location): the environment, exit status 1.

    The message names the location and says that what was there is unchanged."""


class IndexError_(EnvbuilderError):
    """A package index could not be read (unreachable, bad response, offline cache miss)."""


class HttpNotFound(IndexError_):
    """The server answered 404 or 410: the resource does not exist."""


class MissingToolError(EnvbuilderError):
    """Something the command needs is absent (Docker daemon, GPU, uv); the message says how to get it."""

    return_code = 3
