"""The ``.dreamrc`` file and the CLI forms of providers and modes (pure): ``providers:`` with
``!providers.Kube`` tagged entries, ``modes:``, an optional ``server:``; ``--kwarg k=v`` and
``--field k=v`` values parsed as JSON or YAML structures (see :mod:`nymph.launch.config` for what
a provider and a mode are)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nymph.errors import ConfigError
from nymph.launch.config import DEFAULT_DISPATCH, PROVIDER_TAG_PREFIX, Mode, Provider


@dataclass(frozen=True)
class DreamConfig:
    providers: Mapping[str, Provider] = field(default_factory=dict)
    modes: Mapping[str, Mode] = field(default_factory=dict)
    server: Mapping[str, str] = field(default_factory=dict)

    def provider(self, name: str) -> Provider:
        try:
            return self.providers[name]
        except KeyError:
            known = ", ".join(sorted(self.providers)) or "none"
            raise ConfigError(f"no provider named {name!r} (known: {known})") from None

    def mode(self, name: str) -> Mode:
        try:
            return self.modes[name]
        except KeyError:
            known = ", ".join(sorted(self.modes)) or "none"
            raise ConfigError(f"no mode named {name!r} (known: {known})") from None

    def provider_for(self, mode: Mode, explicit: str | None = None) -> Provider:
        """The provider a launch goes to: ``explicit`` if given, else the mode's, else the only one."""
        if explicit:
            return self.provider(explicit)
        if mode.provider:
            return self.provider(mode.provider)
        if len(self.providers) == 1:
            return next(iter(self.providers.values()))
        raise ConfigError(
            f"mode {mode.name!r} names no provider and there are {len(self.providers)}; "
            "pass --provider NAME or set 'provider:' in the mode"
        )


# --- CLI forms -------------------------------------------------------------------------------


def parse_value(text: str) -> Any:
    """Parse a ``--kwarg``/``--field`` value: JSON or YAML structures become data, else a string.

    ``'{"limits":{"cpu":"4"}}'`` -> dict, ``[a, b]`` -> list, ``8`` -> 8, ``true`` -> True,
    ``null`` -> None (unset), ``hello`` -> ``'hello'``. Text that fails to parse stays a string.
    """
    stripped = text.strip()
    if not stripped:
        return text
    try:
        return json.loads(stripped)
    except ValueError:
        pass
    try:
        value = yaml.safe_load(stripped)
    except yaml.YAMLError:
        return text
    if isinstance(value, (dict, list, int, float, bool)) and value is not None:
        return value
    return text


def parse_assignments(items: Iterable[str], *, flag: str) -> dict[str, Any]:
    """``["k=v", ...]`` -> ``{k: parse_value(v)}``; a malformed item is a clear error."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key] = parse_value(value)
    return out


def provider_from_cli(name: str, *, launcher: str, kwargs: Iterable[str]) -> Provider:
    """``--kwarg kubeconfig="$(cat FILE)"`` stays the text it is (inline content), not the
    mapping that text parses to; ``--kwarg kubeconfig='{"$secret": "NAME"}'`` is a reference."""
    items = list(kwargs)
    parsed = parse_assignments(items, flag="--kwarg")
    ref = parsed.get("kubeconfig")
    if isinstance(ref, (dict, list)) and not (isinstance(ref, dict) and "$secret" in ref):
        raw = [i.partition("=")[2] for i in items if i.partition("=")[0].strip() == "kubeconfig"]
        parsed["kubeconfig"] = raw[-1]
    return Provider(name=name, launcher=launcher, kwargs=parsed)


def mode_from_cli(name: str, *, provider: str | None, fields: Iterable[str]) -> Mode:
    """``--field provider=P`` names the provider as ``--provider P`` does."""
    parsed = parse_assignments(fields, flag="--field")
    return Mode(name=name, provider=_lift_provider(parsed, provider, where="--field provider"), fields=parsed)


def _lift_provider(fields: dict[str, Any], provider: Any, *, where: str) -> str | None:
    """Pop ``provider`` out of ``fields``; it must agree with ``provider`` when both are given."""
    if "provider" not in fields:
        return provider if provider is None or isinstance(provider, str) else str(provider)
    named = fields.pop("provider")
    if not isinstance(named, str) or not named:
        raise ConfigError(f"{where}: expected a provider name")
    if provider not in (None, named):
        raise ConfigError(f"{where}={named!r} differs from the provider {provider!r} given beside it")
    return named


# --- .dreamrc --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tagged:
    tag: str
    value: Any


class _DreamLoader(yaml.SafeLoader):
    """SafeLoader that keeps ``!providers.X`` tags so they can be checked, not executed."""


def _construct_tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> _Tagged:
    if isinstance(node, yaml.MappingNode):
        value: Any = loader.construct_mapping(node, deep=True)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_scalar(node)  # type: ignore[arg-type]
    return _Tagged(tag=suffix, value=value)


_DreamLoader.add_multi_constructor(PROVIDER_TAG_PREFIX, _construct_tagged)


def _provider_entry(name: str | None, entry: Any, where: str) -> Provider:
    if isinstance(entry, _Tagged):
        launcher = entry.tag
        body = entry.value if entry.value not in (None, "") else {}
    elif isinstance(entry, dict):
        body = dict(entry)
        launcher = body.pop("launcher", None)
        if launcher is None:
            raise ConfigError(f"{where}: tag the entry '!providers.Kube' or set 'launcher: Kube'")
    else:
        raise ConfigError(f"{where}: expected a '!providers.Kube' mapping")
    if not isinstance(body, dict):
        raise ConfigError(f"{where}: expected a mapping of kwargs")
    body = dict(body)
    if name is None:
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: a list entry needs a 'name'")
    dispatch = body.pop("dispatch", DEFAULT_DISPATCH)
    if isinstance(body.get("kwargs"), dict):
        body = {**body.pop("kwargs"), **body}
    try:
        return Provider(name=name, launcher=launcher, kwargs=body, dispatch=dispatch)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _mode_entry(name: str | None, entry: Any, where: str) -> Mode:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping of fields")
    body = dict(entry)
    if name is None:
        name = body.pop("name", None)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: a list entry needs a 'name'")
    provider = body.pop("provider", None)
    if isinstance(body.get("fields"), dict):
        body = {**body.pop("fields"), **body}
    try:
        provider = _lift_provider(body, provider, where=f"{where}.provider")
        return Mode(name=name, provider=provider, fields=body)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _entries(section: Any, where: str) -> list[tuple[str | None, Any, str]]:
    if section is None:
        return []
    if isinstance(section, dict):
        return [(str(k), v, f"{where}.{k}") for k, v in section.items()]
    if isinstance(section, list):
        return [(None, v, f"{where}[{i}]") for i, v in enumerate(section)]
    raise ConfigError(f"{where}: expected a mapping (name: entry) or a list")


def _document(text: str, *, source: str) -> dict[str, Any]:
    try:
        doc = yaml.load(text, Loader=_DreamLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        # The parser's own words (never the file's text, which may hold a token).
        problem = getattr(exc, "problem", None)
        why = f": {problem}" if isinstance(problem, str) and problem else ""
        raise ConfigError(f"{source}: not valid YAML{at}{why}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a mapping with 'providers:' and 'modes:'")
    return doc


def _server(doc: dict[str, Any], *, source: str) -> dict[str, str]:
    server_raw = doc.get("server") or {}
    if not isinstance(server_raw, dict):
        raise ConfigError(f"{source}: server: expected a mapping with url and token")
    return {str(k): str(v) for k, v in server_raw.items() if v is not None}


def parse_dreamrc(text: str, *, source: str = ".dreamrc") -> DreamConfig:
    doc = _document(text, source=source)
    providers: dict[str, Provider] = {}
    for name, entry, where in _entries(doc.get("providers"), f"{source}: providers"):
        p = _provider_entry(name, entry, where)
        if p.name in providers:
            raise ConfigError(f"{where}: provider {p.name!r} is defined twice")
        providers[p.name] = p
    modes: dict[str, Mode] = {}
    for name, entry, where in _entries(doc.get("modes"), f"{source}: modes"):
        m = _mode_entry(name, entry, where)
        if m.name in modes:
            raise ConfigError(f"{where}: mode {m.name!r} is defined twice")
        if m.provider is not None and m.provider not in providers:
            raise ConfigError(f"{where}: provider {m.provider!r} is not defined in providers:")
        modes[m.name] = m
    return DreamConfig(providers=providers, modes=modes, server=_server(doc, source=source))


def _read(path: str | Path) -> tuple[str, str]:
    p = Path(path).expanduser()
    try:
        return p.read_text(encoding="utf-8"), str(p)
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file; create it or pass --dreamrc PATH") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read ({exc.__class__.__name__})") from None


def load_dreamrc(path: str | Path) -> DreamConfig:
    text, source = _read(path)
    return parse_dreamrc(text, source=source)


def load_server(path: str | Path) -> dict[str, str]:
    """Only the ``server: {url, token}`` of a .dreamrc: a command that needs no provider or
    mode from it works although another entry of the file is wrong."""
    text, source = _read(path)
    return _server(_document(text, source=source), source=source)
