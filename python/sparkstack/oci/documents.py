"""Pure validators for the documents an image source hands over: oci-layout, index.json, manifests,
configs and docker's manifest.json.

Each takes the parsed document and `where` (the file it came from) and returns only checked values,
or raises one line naming the file, the key and the first bad value.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from dataclasses import dataclass

from sparkstack.errors import SparkstackError
from sparkstack.oci.model import (
    DOCKER_MANIFEST_V2, LAYER_GZIP, LAYER_TAR, LAYER_ZSTD, MANIFEST_V1, OCI_EQUIVALENT,
)
from sparkstack.text import quoted

MAX_DOCUMENT = 64 << 20  # index.json, manifests and configs are small; refuse to buffer more
MAX_SIZE = (1 << 63) - 1  # descriptor sizes are int64 in every Go implementation
MAX_INDEX_DEPTH = 8  # real multi-arch images nest once, at most twice
LAYOUT_VERSION = "1.0.0"
LAYER_TYPES = (LAYER_TAR, LAYER_GZIP, LAYER_ZSTD)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Descriptor:
    media_type: str  # as written (docker or OCI)
    digest: str
    size: int
    platform: str | None  # "os/arch[/variant]" when the descriptor declares one


def _fail(where: str, key: str, problem: str) -> SparkstackError:
    return SparkstackError(f"{where}: {key}: {problem}" if key else f"{where}: {problem}")


def _show(value: object) -> str:
    """A document's value in an error: a list or an object by its kind alone, anything else quoted."""
    if isinstance(value, (list, dict)):
        return f"a list of {len(value)}" if isinstance(value, list) else "an object"
    return quoted(value, 80)


def _sub(key: str, name: str | int) -> str:
    if isinstance(name, int):
        return f"{key}[{name}]"
    return f"{key}.{name}" if key else name


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    # 1e400 parses to inf, which would be written back as the non-JSON token Infinity.
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def parse_json(data: bytes, where: str) -> object:
    """Strict JSON from UTF-8 bytes; every string in it must be writable back as UTF-8."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SparkstackError(f"{where}: not UTF-8 (bad byte at offset {exc.start})") from None
    try:
        doc = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
        # A "\ud800" escape parses to a lone surrogate, which no UTF-8 writer can emit later.
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise SparkstackError(f"{where}: nested too deeply") from None
    except UnicodeEncodeError:
        raise SparkstackError(f"{where}: holds a string with an unpaired surrogate escape") from None
    except ValueError as exc:  # JSONDecodeError, and integers too long to convert
        reason = "an integer with too many digits" if "integer string conversion" in str(exc) else str(exc)
        raise SparkstackError(f"{where}: not JSON ({reason})") from None
    return doc


def _object(value: object, where: str, key: str) -> dict:
    if not isinstance(value, dict):
        raise _fail(where, key, f"expected a JSON object, got {_show(value)}")
    return value


def _list(value: object, where: str, key: str) -> list:
    if not isinstance(value, list):
        raise _fail(where, key, f"expected a JSON list, got {_show(value)}")
    return value


def _required(doc: dict, name: str, where: str, key: str) -> object:
    if name not in doc:
        raise _fail(where, _sub(key, name), "missing")
    return doc[name]


def _string(value: object, where: str, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(where, key, f"expected a non-empty string, got {_show(value)}")
    return value


def check_digest(value: object, where: str, key: str) -> str:
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        raise _fail(where, key, f"{_show(value)} is not a sha256 digest (\"sha256:\" and 64 lowercase hex)")
    return value


def check_size(value: object, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SIZE:
        raise _fail(where, key, f"{_show(value)} is not a size (a whole number of bytes, 0 to 2^63-1)")
    return value


def _platform_part(value: object, where: str, key: str) -> str:
    # "/" joins the parts of a platform string, so it may not hide inside one.
    if not isinstance(value, str) or not value or "/" in value:
        raise _fail(where, key, f"expected a name without \"/\", got {_show(value)}")
    return value


def platform_of(doc: dict, where: str, key: str) -> str:
    """os/architecture[/variant] of a descriptor's platform object or of a config."""
    parts = [_platform_part(_required(doc, "os", where, key), where, _sub(key, "os")),
             _platform_part(_required(doc, "architecture", where, key), where, _sub(key, "architecture"))]
    if doc.get("variant") not in (None, ""):
        parts.append(_platform_part(doc["variant"], where, _sub(key, "variant")))
    return "/".join(parts)


def descriptor(value: object, where: str, key: str) -> Descriptor:
    doc = _object(value, where, key)
    media = _string(_required(doc, "mediaType", where, key), where, _sub(key, "mediaType"))
    digest = check_digest(_required(doc, "digest", where, key), where, _sub(key, "digest"))
    size = check_size(_required(doc, "size", where, key), where, _sub(key, "size"))
    platform = None
    if "platform" in doc:
        platform = platform_of(_object(doc["platform"], where, _sub(key, "platform")), where, _sub(key, "platform"))
    return Descriptor(media, digest, size, platform)


def _schema_version(doc: dict, where: str) -> None:
    version = doc.get("schemaVersion", 2)
    if isinstance(version, bool) or version != 2:
        raise _fail(where, "schemaVersion", f"expected 2, got {_show(version)}")


def check_layout_marker(doc: object, where: str) -> None:
    """oci-layout: {"imageLayoutVersion": "1.0.0"}."""
    version = _required(_object(doc, where, ""), "imageLayoutVersion", where, "")
    if version != LAYOUT_VERSION:
        raise _fail(where, "imageLayoutVersion", f"expected {LAYOUT_VERSION!r}, got {_show(version)}")


def index_entries(doc: object, where: str) -> tuple[Descriptor, ...]:
    """The descriptors an image index (index.json, or a nested index blob) lists."""
    doc = _object(doc, where, "")
    _schema_version(doc, where)
    manifests = _list(_required(doc, "manifests", where, ""), where, "manifests")
    if not manifests:
        raise _fail(where, "manifests", "lists no manifests")
    return tuple(descriptor(d, where, _sub("manifests", i)) for i, d in enumerate(manifests))


def manifest_parts(doc: object, where: str) -> tuple[Descriptor, tuple[Descriptor, ...]]:
    """An image manifest's config descriptor and layer descriptors (layer media types mapped to OCI's)."""
    doc = _object(doc, where, "")
    _schema_version(doc, where)
    media = doc.get("mediaType", MANIFEST_V1)
    if media not in (MANIFEST_V1, DOCKER_MANIFEST_V2):
        raise _fail(where, "mediaType", f"{_show(media)} is not an image manifest")
    config = descriptor(_required(doc, "config", where, ""), where, "config")
    layers = []
    for i, value in enumerate(_list(_required(doc, "layers", where, ""), where, "layers")):
        d = descriptor(value, where, _sub("layers", i))
        media = OCI_EQUIVALENT.get(d.media_type, d.media_type)
        if media not in LAYER_TYPES:
            raise _fail(where, _sub(_sub("layers", i), "mediaType"), f"unsupported layer type {_show(d.media_type)}")
        layers.append(Descriptor(media, d.digest, d.size, d.platform))
    return config, tuple(layers)


def config_parts(doc: object, where: str, n_layers: int) -> tuple[str, tuple[str, ...]]:
    """An image config's platform and diff_ids, after checking what a derived config will build on."""
    doc = _object(doc, where, "")
    platform = platform_of(doc, where, "")
    rootfs = _object(_required(doc, "rootfs", where, ""), where, "rootfs")
    values = _list(_required(rootfs, "diff_ids", where, "rootfs"), where, "rootfs.diff_ids")
    diff_ids = tuple(check_digest(v, where, _sub("rootfs.diff_ids", i)) for i, v in enumerate(values))
    if len(diff_ids) != n_layers:
        raise _fail(where, "rootfs.diff_ids", f"lists {len(diff_ids)} diff_ids for {n_layers} layers")
    if "config" in doc:  # the runtime config a derived image adds its labels to
        run = _object(doc["config"], where, "config")
        if run.get("Labels") is not None:
            _object(run["Labels"], where, "config.Labels")
    if doc.get("history") is not None:
        _list(doc["history"], where, "history")
    return platform, diff_ids


def member_name(value: object, where: str, key: str) -> str:
    """A path inside an archive, normalised; never absolute, never above the archive root."""
    name = _string(value, where, key)
    norm = posixpath.normpath(name)
    if norm.startswith("/") or norm == "." or norm.split("/")[0] == ".." or "\0" in norm:
        raise _fail(where, key, f"{_show(name)} is not a path inside the archive")
    return norm


def docker_entries(doc: object, where: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """docker's manifest.json: (Config, Layers) member names of each image it describes."""
    entries = []
    for i, value in enumerate(_list(doc, where, "")):
        key = f"[{i}]"
        entry = _object(value, where, key)
        config = member_name(_required(entry, "Config", where, key), where, f"{key}.Config")
        layers = _list(_required(entry, "Layers", where, key), where, f"{key}.Layers")
        entries.append((config, tuple(member_name(v, where, f"{key}.Layers[{j}]") for j, v in enumerate(layers))))
    return tuple(entries)
