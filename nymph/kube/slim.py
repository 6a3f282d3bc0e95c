"""Load the generated Kubernetes client one class at a time instead of all at once.

``kubernetes_asyncio.client`` (and its ``api`` and ``models`` packages) import every generated
API and model class in their ``__init__``: about 850 modules and 30 MB of a process that uses a
Pod watch and a handful of calls. :func:`install` puts light packages in their place before
anything imports them: each resolves a name (``client.CoreV1Api``, ``models.V1Pod``) on first
use by importing only the module that defines it, read from the real ``__init__``'s own
``from ... import`` lines, so every name the full package offers is still there.

It changes nothing when the client is already imported, is not installed, or its ``__init__``
no longer has the expected shape (then the normal import happens).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGES = (
    "kubernetes_asyncio",
    "kubernetes_asyncio.client",
    "kubernetes_asyncio.client.api",
    "kubernetes_asyncio.client.models",
)
#: The top package only imports its subpackages (client, config, dynamic, stream, utils, watch):
#: each is imported when first used.
_TOP = "kubernetes_asyncio"
_FROM = re.compile(r"^from (kubernetes_asyncio\.client[\w.]*) import (\w+)[ \t]*$", re.M)
_VERSION = re.compile(r"^__version__ = \"([^\"]+)\"", re.M)
#: Names the client package must define for its ``__init__`` to be understood.
_EXPECTED = {"kubernetes_asyncio.client": ("ApiClient", "Configuration", "CoreV1Api", "V1Pod")}


def _package_dir() -> Path | None:
    try:
        spec = importlib.util.find_spec("kubernetes_asyncio")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _light(name: str, directory: Path) -> ModuleType | None:
    init = directory / "__init__.py"
    try:
        source = init.read_text(encoding="utf-8")
    except OSError:
        return None
    where = {attr: module for module, attr in _FROM.findall(source)}
    if (not where and name != _TOP) or any(attr not in where for attr in _EXPECTED.get(name, ())):
        return None
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(directory)])
    if spec is None:
        return None
    module = importlib.util.module_from_spec(spec)
    version = _VERSION.search(source)
    if version:
        module.__version__ = version.group(1)  # type: ignore[attr-defined]

    def __getattr__(attr: str) -> Any:
        home = where.get(attr)
        if home is None:
            # A submodule (``client.rest``, ``client.models``) not imported through this name yet.
            if not attr.startswith("_") and (
                (directory / f"{attr}.py").exists() or (directory / attr / "__init__.py").exists()
            ):
                value = importlib.import_module(f"{name}.{attr}")
                setattr(module, attr, value)
                return value
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        value = getattr(importlib.import_module(home), attr)
        setattr(module, attr, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(module.__dict__) | set(where))

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    module.__dir__ = __dir__  # type: ignore[method-assign]
    module.__all__ = sorted(where)  # type: ignore[attr-defined]
    return module


def install() -> bool:
    """Put the light packages in place; True when they are (now or already) the ones in use."""
    if any(name in sys.modules for name in PACKAGES):
        return all(getattr(sys.modules.get(name), "__getattr__", None) is not None for name in PACKAGES)
    base = _package_dir()
    if base is None:
        return False
    light = {}
    for name in PACKAGES:
        module = _light(name, base.joinpath(*name.split(".")[1:]))
        if module is None:
            return False
        light[name] = module
    sys.modules.update(light)
    light[_TOP].client = light["kubernetes_asyncio.client"]  # type: ignore[attr-defined]
    client = light["kubernetes_asyncio.client"]
    client.api = light["kubernetes_asyncio.client.api"]  # type: ignore[attr-defined]
    client.models = light["kubernetes_asyncio.client.models"]  # type: ignore[attr-defined]
    return True
