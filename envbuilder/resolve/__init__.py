"""Resolution: the matrix and its selectors, wheels for a target, the evidence from the
indexes, the decisions taken from it, the closure locked by uv, and the scheduler."""
