"""Using the compatibility lockfile on a user's machine: ``query``, ``install``,
``export``, ``doctor``, ``verify``.

`query` and `advice` answer which row fits a host (`host`, `interpreter`, `installed`),
`query_text` and `query_json` lay the answer out;
`export` and `install` turn a row into a hash-pinned install (`runtime_path` hooks the
CUDA runtime into the venv, `published_wheel` fetches a source-built wheel); `published`,
`snapshot` and `provenance` find the lockfile (a URL, the copy the wheel carries) and
check its attestation; `doctor` (with `record_check`, `_checkcache` and the probes
`_envprobe`, `_extload`, `_smoke`, which run by path inside the checked environment)
checks an installed environment against its row. The document and its rules live in
`envbuilder.lockfile`; making it is `envbuilder.aggregate`.
"""
