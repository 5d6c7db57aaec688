"""The Simple Repository API: PEP 691 JSON and PEP 503 HTML into the same records.

Also reads a flat find-links page and a local directory of wheels, since a
locally built torch may live in one.

A page is read whole or refused: a file entry with fields of the wrong types,
or a remote page linking a file outside HTTP(S) (``file://``), is an
`IndexError_` naming the page, never a page with that file left out (which
would read as "not on the index"). A 404 for a project is an empty page
only when the index itself answers; a 404 for the index is an error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from envbuilder import jsondoc
from envbuilder.credentials import split_credentials
from envbuilder.errors import IndexError_
from envbuilder.files import sha256_file
from envbuilder.index.http import HttpClient, HttpNotFound

__all__ = [
    "ACCEPT",
    "DistributionFile",
    "ProjectPage",
    "fetch_find_links",
    "fetch_project_page",
    "is_local",
    "list_local_directory",
    "local_path",
    "parse_html_page",
    "parse_json_page",
    "parse_project_page",
    "project_url",
    "wheel_platforms",
]

logger = logging.getLogger(__name__)

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
HTML_TYPES = frozenset({"application/vnd.pypi.simple.v1+html", "text/html"})
ACCEPT = f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"

CoreMetadata = bool | dict[str, str]


@dataclass(frozen=True, kw_only=True)
class DistributionFile:
    """One file of a project on an index (a wheel or an sdist)."""

    filename: str
    url: str  # absolute, fragment stripped
    hashes: dict[str, str] = field(default_factory=dict)
    requires_python: str | None = None
    yanked: bool = False
    yanked_reason: str | None = None
    core_metadata: CoreMetadata = False  # PEP 658/714: False, True, or {"sha256": ...}
    size: int | None = None
    upload_time: str | None = None

    @property
    def sha256(self) -> str | None:
        return self.hashes.get("sha256")

    @property
    def is_wheel(self) -> bool:
        return self.filename.endswith(".whl")

    @property
    def project(self) -> str | None:
        """The normalised project name read from the filename, or None if unparseable."""
        parsed = _parse_filename(self.filename)
        return parsed[0] if parsed else None

    @property
    def version(self) -> Version | None:
        parsed = _parse_filename(self.filename)
        return parsed[1] if parsed else None


@dataclass(frozen=True, kw_only=True)
class ProjectPage:
    """A project's files as one index lists them. A project the index lacks has no files."""

    name: str  # PEP 503-normalised
    url: str
    files: tuple[DistributionFile, ...] = ()
    versions: tuple[str, ...] = ()
    etag: str | None = None
    last_modified: str | None = None


def wheel_platforms(filename: str) -> list[str]:
    """The platform tags in a wheel's filename (``manylinux_2_28_x86_64``, ``any``)."""
    return filename.removesuffix(".whl").rsplit("-", 1)[-1].split(".")


def _parse_filename(filename: str) -> tuple[str, Version] | None:
    try:
        if filename.endswith(".whl"):
            name, version, _build, _tags = parse_wheel_filename(filename)
            return str(name), version
        name, version = parse_sdist_filename(filename)
        return str(name), version
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None


def project_url(index_url: str, project: str) -> str:
    """``<index>/<normalised name>/`` (PEP 503)."""
    return f"{index_url.rstrip('/')}/{canonicalize_name(project)}/"


def _split_url(url: str, base: str, page_url: str | None = None) -> tuple[str, dict[str, str]]:
    """Absolute URL without fragment or user name and password, and the hash the
    fragment names (``#sha256=...``). With ``page_url`` on HTTP(S), a file URL that
    is not HTTP(S) is refused: a remote index must not point a lock at local files."""
    absolute = split_credentials(urllib.parse.urljoin(base, url))[0]
    if page_url is not None and not is_local(page_url) and is_local(absolute):
        raise IndexError_(
            f"{page_url!r} links {absolute.split('#')[0]!r}, which is not an http(s) URL; "
            "a remote index may only list files on http(s)"
        )
    clean, fragment = urllib.parse.urldefrag(absolute)
    hashes: dict[str, str] = {}
    if fragment:
        algo, sep, value = fragment.partition("=")
        if sep and algo in hashlib.algorithms_guaranteed and value:
            hashes[algo] = value.lower()
    return clean, hashes


def _sorted_versions(values: Iterable[object]) -> tuple[str, ...]:
    """Versions in PEP 440 order; strings that are not versions go last, as given."""
    parsed: list[Version] = []
    other: list[str] = []
    for value in values:
        try:
            parsed.append(Version(str(value)))
        except InvalidVersion:
            other.append(str(value))
    return tuple([str(v) for v in sorted(parsed)] + other)


def _versions_from(files: Iterable[DistributionFile]) -> tuple[str, ...]:
    versions = {f.version for f in files if f.version is not None}
    return tuple(str(v) for v in sorted(versions))


# -- PEP 691 JSON ---------------------------------------------------------------------------


def _preferred(values: Iterable[CoreMetadata]) -> CoreMetadata:
    """PEP 714's ``core-metadata`` and the older ``dist-info-metadata`` together: the
    first that gives a hash, else whether either says the file exists."""
    given = list(values)
    for value in given:
        if isinstance(value, dict):
            return value
    return any(given)


def _json_file(entry: object, page_url: str, number: int) -> DistributionFile:
    """Entry ``number`` of a PEP 691 ``files`` list; `IndexError_` when a field has the
    wrong type (reading it as absent would hide a file the index lists)."""
    where = f"{page_url!r}: file entry {number}"
    if not isinstance(entry, dict):
        raise IndexError_(f"{where} is a {type(entry).__name__}, not an object")
    filename = entry.get("filename")
    if isinstance(filename, str) and filename:
        where += f" ({filename!r})"

    def field(key: str, *types: type, required: bool = False) -> Any:
        value = entry.get(key)
        if value is None and not required:
            return None
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            wanted = " or ".join(t.__name__ for t in types)
            raise IndexError_(
                f"{where}: {key!r} is {value!r:.80}, not a {wanted}; the page is not a valid "
                "PEP 691 page"
            )
        return value

    filename, url = field("filename", str, required=True), field("url", str, required=True)
    if not filename or not url:
        raise IndexError_(f"{where}: an empty 'filename' or 'url'")
    hashes = field("hashes", dict) or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in hashes.items()):
        raise IndexError_(f"{where}: 'hashes' must map names to strings, not {hashes!r:.80}")
    metadata: list[CoreMetadata] = []
    for key in ("core-metadata", "dist-info-metadata"):
        value = field(key, bool, dict)
        if isinstance(value, dict):
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                raise IndexError_(f"{where}: {key!r} must map names to strings")
            value = {k: v.lower() for k, v in value.items()}
        metadata.append(bool(value) if value is None or isinstance(value, bool) else value)
    requires_python = field("requires-python", str) or None
    yanked = field("yanked", bool, str) or False
    size, uploaded = field("size", int), field("upload-time", str)
    absolute, fragment_hashes = _split_url(url, page_url, page_url)
    return DistributionFile(
        filename=filename,
        url=absolute,
        hashes={k: v.lower() for k, v in hashes.items()} or fragment_hashes,
        requires_python=requires_python,
        yanked=bool(yanked),
        yanked_reason=yanked if isinstance(yanked, str) and yanked else None,
        core_metadata=_preferred(metadata),
        size=size,
        upload_time=uploaded,
    )


def _check_api_version(version: str, page_url: str) -> None:
    """PEP 691: a client refuses a major version it does not know (this one reads 1.x); a
    newer minor version only adds."""
    major, _, minor = version.partition(".")
    if not major.isdigit() or not (minor.isdigit() or not minor):
        raise IndexError_(
            f"{page_url!r}: meta.api-version {version!r} is not a version; envbuilder reads"
            " the Simple API 1.x"
        )
    if int(major) != 1:
        raise IndexError_(
            f"{page_url!r}: meta.api-version {version!r} is major version {int(major)};"
            " envbuilder reads the Simple API 1.x only (PEP 691: a client refuses other major"
            " versions)"
        )


def parse_json_page(
    document: bytes | str | Mapping[str, Any], *, page_url: str, project: str
) -> ProjectPage:
    """A PEP 691 JSON project page."""
    if isinstance(document, Mapping):
        data: Any = document
    else:
        try:
            data = jsondoc.parse(document)
        except jsondoc.NotJSON as e:
            raise IndexError_(f"{page_url!r}: not a valid PEP 691 JSON page ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        raise IndexError_(f"{page_url!r}: PEP 691 JSON page without a 'files' list")
    meta = data.get("meta")
    if not isinstance(meta, dict) or not isinstance(meta.get("api-version"), str):
        raise IndexError_(f"{page_url!r}: PEP 691 JSON page without meta.api-version")
    _check_api_version(str(meta["api-version"]), page_url)
    files = [_json_file(entry, page_url, n) for n, entry in enumerate(data["files"])]
    name = canonicalize_name(str(data.get("name") or project))
    versions = data.get("versions")
    return ProjectPage(
        name=name,
        url=page_url,
        files=tuple(files),
        versions=_sorted_versions(versions)
        if isinstance(versions, list)
        else _versions_from(files),
    )


# -- PEP 503 HTML ---------------------------------------------------------------------------


class _AnchorCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.base: str | None = None
        self.repository_version: str | None = None  # PEP 629's pypi:repository-version
        self.links_for = False  # the "Links for <project>" heading of PEP 503 pages
        self.anchors: list[tuple[dict[str, str | None], str]] = []
        self._current: dict[str, str | None] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "base" and self.base is None:
            self.base = dict(attrs).get("href")
        elif tag == "meta" and dict(attrs).get("name") == "pypi:repository-version":
            self.repository_version = dict(attrs).get("content")
        elif tag == "a":
            self._flush()
            self._current = dict(attrs)
            self._text = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._flush()

    def handle_data(self, data: str) -> None:
        if data.strip().lower().startswith("links for "):
            self.links_for = True
        if self._current is not None:
            self._text.append(data)

    def _flush(self) -> None:
        if self._current is not None:
            self.anchors.append((self._current, "".join(self._text).strip()))
        self._current = None
        self._text = []

    def close(self) -> None:
        super().close()
        self._flush()


def _html_core_metadata(attrs: Mapping[str, str | None]) -> CoreMetadata:
    values: list[CoreMetadata] = []
    for key in ("data-core-metadata", "data-dist-info-metadata"):
        if key not in attrs:
            continue
        value = (attrs[key] or "").strip()
        algo, sep, digest = value.partition("=")
        if value == "false":
            values.append(False)
        elif sep and digest:
            values.append({algo: digest.lower()})
        else:
            values.append(True)
    return _preferred(values)


def parse_html_page(
    document: bytes | str, *, page_url: str, project: str | None = None
) -> ProjectPage:
    """A PEP 503 HTML page; with ``project``, keeps only that project's files (flat pages)."""
    return _parse_html(document, page_url=page_url, project=project)[0]


def _parse_html(
    document: bytes | str, *, page_url: str, project: str | None
) -> tuple[ProjectPage, _AnchorCollector]:
    text = document.decode("utf-8", errors="replace") if isinstance(document, bytes) else document
    parser = _AnchorCollector()
    try:
        parser.feed(text)
        parser.close()
    except AssertionError as e:
        # html.parser (before Python 3.13) asserts on some markup, e.g. `<![DOCTYPE`
        raise IndexError_(f"{page_url!r}: not an HTML page html.parser can read ({e})") from e
    base = urllib.parse.urljoin(page_url, parser.base) if parser.base else page_url
    wanted = canonicalize_name(project) if project else None
    files: list[DistributionFile] = []
    for attrs, anchor_text in parser.anchors:
        href = attrs.get("href")
        if not href:
            continue
        url, hashes = _split_url(href, base, page_url)
        filename = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
        if not filename:
            filename = anchor_text
        if wanted is not None:
            parsed = _parse_filename(filename)
            if parsed is None or parsed[0] != wanted:
                logger.debug("skipping %s on %s: not a file of %s", filename, page_url, wanted)
                continue
        yanked = "data-yanked" in attrs
        files.append(
            DistributionFile(
                filename=filename,
                url=url,
                hashes=hashes,
                requires_python=(attrs.get("data-requires-python") or "").strip() or None,
                yanked=yanked,
                yanked_reason=(attrs.get("data-yanked") or None) if yanked else None,
                core_metadata=_html_core_metadata(attrs),
            )
        )
    name = wanted or canonicalize_name(project or _last_path_segment(page_url))
    page = ProjectPage(name=name, url=page_url, files=tuple(files), versions=_versions_from(files))
    return page, parser


def _check_simple_html(
    document: bytes, page: ProjectPage, parser: _AnchorCollector, *, page_url: str
) -> None:
    """Refuse an HTML answer that is not a whole Simple API project page.

    A captive portal or an error page served with HTTP 200 lists no files (or
    links that are not files); a body cut short by a wrong Content-Length lacks
    the closing ``</html>`` every index writes. Read as pages they would say
    "not on the index"; refused, they are an error naming the URL.
    """
    if b"</html" not in document[-4096:].lower():
        raise IndexError_(
            f"{page_url!r}: the page ends before </html> (a truncated response?); "
            "not reading it as the index's list of files"
        )
    if parser.anchors and not any(_parse_filename(f.filename) for f in page.files):
        raise IndexError_(
            f"{page_url!r}: HTTP 200 but not an index page: none of its "
            f"{len(parser.anchors)} link(s) is a distribution file "
            "(a login or captive portal page?)"
        )
    if not parser.anchors and parser.repository_version is None and not parser.links_for:
        raise IndexError_(
            f"{page_url!r}: HTTP 200 but not an index page: no links, no "
            "pypi:repository-version and no 'Links for' heading (an error or captive "
            "portal page?)"
        )


def _last_path_segment(url: str) -> str:
    parts = [p for p in urllib.parse.urlsplit(url).path.split("/") if p]
    return parts[-1] if parts else ""


def parse_project_page(
    content: bytes, *, content_type: str, page_url: str, project: str
) -> ProjectPage:
    """Dispatch on the response's Content-Type, as PEP 691 asks; refuse (`IndexError_`)
    an answer that is not a whole project page (see `_check_simple_html`)."""
    media = content_type.split(";")[0].strip().lower()
    if media == JSON_TYPE:
        return parse_json_page(content, page_url=page_url, project=project)
    if media in HTML_TYPES or media == "":
        page, parser = _parse_html(content, page_url=page_url, project=None)
        _check_simple_html(content, page, parser, page_url=page_url)
        return dataclasses.replace(page, name=canonicalize_name(project))
    raise IndexError_(
        f"{page_url!r}: unsupported Content-Type {content_type!r} for a Simple API page "
        f"(expected {JSON_TYPE} or HTML)"
    )


# -- fetching -------------------------------------------------------------------------------


def is_local(location: str) -> bool:
    """A ``file://`` URL or a filesystem path (anything without an http(s) scheme)."""
    scheme = urllib.parse.urlsplit(location).scheme.lower()
    return scheme not in ("http", "https")


def local_path(location: str) -> Path:
    if location.lower().startswith("file:"):
        return Path(urllib.request.url2pathname(urllib.parse.urlsplit(location).path))
    return Path(location)


def list_local_directory(directory: Path, project: str | None = None) -> ProjectPage:
    """The wheels in a directory (of ``project`` only, if given), with sha256 computed here."""
    if not directory.is_dir():
        raise IndexError_(f"{str(directory)!r} is not a directory of wheels")
    wanted = canonicalize_name(project) if project else None
    files: list[DistributionFile] = []
    for path in sorted(directory.glob("*.whl")):
        parsed = _parse_filename(path.name)
        if parsed is None or (wanted is not None and parsed[0] != wanted):
            continue
        files.append(
            DistributionFile(
                filename=path.name,
                url=path.resolve().as_uri(),
                hashes={"sha256": sha256_file(path)},
                size=path.stat().st_size,
            )
        )
    return ProjectPage(
        name=wanted or canonicalize_name(directory.name),
        url=directory.resolve().as_uri(),
        files=tuple(files),
        versions=_versions_from(files),
    )


def _local_project_page(location: str, project: str) -> ProjectPage:
    root = local_path(location)
    name = canonicalize_name(project)
    project_dir = root / name
    if project_dir.is_dir():
        index_html = project_dir / "index.html"
        if index_html.is_file():
            return parse_html_page(
                index_html.read_bytes(), page_url=index_html.resolve().as_uri(), project=None
            )
        return list_local_directory(project_dir, name)
    if root.is_dir():
        return list_local_directory(root, name)
    if root.is_file() and root.suffix in (".html", ".htm"):
        return parse_html_page(root.read_bytes(), page_url=root.resolve().as_uri(), project=name)
    logger.debug("local index %s has nothing for %s", root, name)
    return ProjectPage(name=name, url=root.as_uri() if root.is_absolute() else str(root))


def fetch_project_page(client: HttpClient, index_url: str, project: str) -> ProjectPage:
    """The project's page on a Simple API index (or a local directory of wheels).

    A project the index does not have (HTTP 404) gives an empty page. An answer
    that is not a project page is an `IndexError_` naming the URL, and is dropped
    from the HTTP cache so that the next run asks again.
    """
    if is_local(index_url):
        return _local_project_page(index_url, project)
    url = project_url(index_url, project)
    try:
        response = client.get(url, headers={"Accept": ACCEPT})
    except HttpNotFound as e:
        root = index_url.rstrip("/") + "/"
        if client.exists(root) is False:
            raise IndexError_(
                f"the index {client.credentials.show(root)!r} does not exist (HTTP 404 for "
                f"the index itself, not only for {project}); check the index URL"
            ) from e
        logger.debug("%s: no project %s (404)", index_url, project)
        return ProjectPage(name=canonicalize_name(project), url=url)
    try:
        page = parse_project_page(
            response.content,
            content_type=response.headers.get("content-type", ""),
            page_url=response.url,
            project=project,
        )
    except IndexError_:
        client.forget(url)
        raise
    if not page.files:
        logger.info("%s lists no files for %s", response.url, project)
    return ProjectPage(
        name=page.name,
        url=page.url,
        files=page.files,
        versions=page.versions,
        etag=response.headers.get("etag"),
        last_modified=response.headers.get("last-modified"),
    )


def fetch_find_links(client: HttpClient, location: str, project: str) -> ProjectPage:
    """``project``'s files on a flat find-links page (one page listing every project's files)."""
    if is_local(location):
        return _local_project_page(location, project)
    try:
        response = client.get(location, headers={"Accept": "text/html"})
    except HttpNotFound as e:
        raise IndexError_(
            f"the find-links page {client.credentials.show(location)!r} does not exist "
            "(HTTP 404); check its URL"
        ) from e
    return parse_html_page(response.content, page_url=response.url, project=project)
