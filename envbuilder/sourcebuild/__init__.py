"""Building xformers (or any locked sdist) from source: hermetic, cached, reproducible.

`key` computes the build key from the build's inputs (pure); `reproducible`
rewrites a built wheel so that the same inputs give the same bytes (pure);
`cache` keeps built wheels by key; `builder` runs a build, in a container of
a builder image without network or in a scratch venv on the host.
"""
