"""Records the index pages tests/unit/test_recorded_platforms.py decides from
(run: python tests/data/pages/record.py; needs the network).

From the default index (pip's configuration), for each release below: its
PEP 691 JSON page cut to that release's files (URLs made relative, so no host
is written here), each wheel's Requires-Dist, and xformers' build record
(``xformers/cpp_lib.json``, read by range requests). torch's wheels are cut
to CPython 3.11 to keep the file small. Running it again gives the same bytes
unless the index changed (a yanked file, a new build).
"""

from __future__ import annotations

import json
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from envbuilder.index import remotewheel, simple
from envbuilder.index.http import HttpClient
from envbuilder.index.pipconfig import default_index_url
from envbuilder.resolve.evidence import BUILD_RECORD, file_version

HERE = Path(__file__).parent
RELEASES = {
    "torch": ("2.8.0", "cp311"),
    "xformers": ("0.0.32.post2", None),
    "nvidia-cuda-runtime-cu12": ("12.8.90", None),
}


def main() -> None:
    index = default_index_url()
    with HttpClient() as client:
        for project, (version, python) in RELEASES.items():
            page = simple.fetch_project_page(client, index, project)
            files = []
            for f in page.files:
                found = file_version(f.filename, project)
                if found is None or str(found) != version:
                    continue
                tags = parse_wheel_filename(f.filename)[3]
                if python and not any(t.interpreter == python for t in tags):
                    continue
                entry: dict[str, object] = {
                    "filename": f.filename,
                    "url": f.filename,
                    "hashes": f.hashes,
                    "requires-python": f.requires_python,
                    "size": f.size,
                    "metadata": {
                        "requires-dist": remotewheel.read_core_metadata(client, f).get_all(
                            "Requires-Dist"
                        )
                        or []
                    },
                }
                if project == "xformers":
                    record = remotewheel.read_member(client, f, BUILD_RECORD)
                    entry["build-record"] = json.loads(record) if record else None
                files.append(entry)
            document = {
                "meta": {"api-version": "1.1"},
                "name": str(canonicalize_name(project)),
                "files": sorted(files, key=lambda e: str(e["filename"])),
            }
            out = HERE / f"{canonicalize_name(project)}.json"
            out.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            print(f"{out}: {len(files)} files")


if __name__ == "__main__":
    main()
