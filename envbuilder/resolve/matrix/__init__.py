"""Load and validate ``matrix.toml`` into immutable `Combination` records.

The format is documented in ``docs/matrix.md``. Loading reads the file and the
environment (for ``${VAR}`` in index URLs) and writes nothing; every problem
in the file is reported at once in one `ConfigError`. An index URL whose
variable is unset is a problem only for what fetches from it
(`Matrix.require_index_urls`): selecting, planning jobs and building from
locks need no index URL.
"""

from envbuilder.resolve.matrix.records import (
    DEFAULT_RUNNER,
    Matrix,
    MatrixDefaults,
    Runners,
    Suite,
    combination_id,
)
from envbuilder.resolve.matrix.sections import load_matrix, parse_matrix

__all__ = [
    "DEFAULT_RUNNER",
    "Matrix",
    "MatrixDefaults",
    "Runners",
    "Suite",
    "combination_id",
    "load_matrix",
    "parse_matrix",
]
