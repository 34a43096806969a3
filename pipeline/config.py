"""The YAML pipeline config: loading, ``${env:...}`` substitution, typed component configs.

Shape (after the OpenTelemetry Collector)::

    receivers:  {<id>: {...}}        # id = "type" or "type/name"
    processors: {<id>: {...}}
    exporters:  {<id>: {...}}
    service:
      state_dir: ~/.aep
      telemetry: {logs: {level: info}, metrics: {endpoint: 127.0.0.1:8889}}
      pipelines:
        <name>: {receivers: [...], processors: [...], exporters: [...]}

Every error names the file, the key path and what was expected, and every error of a file is
reported at once (``ConfigErrors``): a file with three typos takes one run to fix, not three.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .component import Factory, Kind, Registry

# A default is literal text: ``$$`` in it is a ``$`` as anywhere else, and a ``${`` in it (a nested
# substitution) is not a default at all: it falls to the last branch, an error, never literal text.
_ENV = re.compile(r"\$\$|\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-((?:\$\$|\$(?!\{)|[^$}])*))?\}|\$\{([^}]*)\}")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
MAPPING_TYPE = "mapping"
"""The processor type that turns receivers' vendor signals into event drafts."""
ID_PATTERN = re.compile(r"^[a-z][a-z0-9_]*(/[A-Za-z0-9._-]+)?$")
_NUMBER = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")
_LEADING_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ConfigError(ValueError):
    """A config problem, rendered as ``file: key.path: message``."""

    def __init__(self, file: str, path: str, message: str) -> None:
        self.file, self.path, self.message = file, path, message
        where = f"{file}: {path}: " if path else f"{file}: "
        super().__init__(where + message)

    @property
    def errors(self) -> list[ConfigError]:
        return [self]


class ConfigErrors(ConfigError):
    """Every problem found in one config, in file order; ``file``/``path``/``message`` are the first's."""

    def __init__(self, errors: list[ConfigError]) -> None:
        flat = [e for err in errors for e in err.errors]
        self._errors = flat
        self.file, self.path, self.message = flat[0].file, flat[0].path, flat[0].message
        ValueError.__init__(self, "\n".join(str(e) for e in flat))

    @property
    def errors(self) -> list[ConfigError]:
        return list(self._errors)


class _Collect:
    """Gathers the errors of independent checks; ``done()`` raises them all together."""

    def __init__(self) -> None:
        self.errors: list[ConfigError] = []

    @contextlib.contextmanager
    def check(self) -> Iterator[None]:
        try:
            yield
        except ConfigError as exc:
            self.errors.extend(exc.errors)

    def add(self, file: str, path: str, message: str) -> None:
        self.errors.append(ConfigError(file, path, message))

    def done(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise ConfigErrors(self.errors)


@dataclass
class PipelineSpec:
    name: str
    receivers: list[str]
    processors: list[str]
    exporters: list[str]


@dataclass
class LogsConfig:
    """``service.telemetry.logs``."""

    level: str = "info"

    def validate(self) -> None:
        if self.level.lower() not in ("debug", "info", "warning", "error"):
            raise ConfigError("", "level", "expected debug, info, warning or error")


@dataclass
class MetricsConfig:
    """``service.telemetry.metrics``: the Prometheus endpoint, off unless given."""

    endpoint: str | None = None

    def validate(self) -> None:
        if self.endpoint is not None:
            parse_endpoint(self.endpoint, "", "endpoint")


@dataclass
class HealthConfig:
    """``service.telemetry.health``."""

    window: float = 60.0
    """Seconds an incident (a failed hook, a malformed command) stays in ``/healthz`` after its last occurrence."""

    def validate(self) -> None:
        if self.window <= 0:
            raise ConfigError("", "window", "expected a positive number of seconds")


@dataclass
class TelemetryConfig:
    """``service.telemetry``; the flat properties are what the service and CLI read."""

    logs: LogsConfig = field(default_factory=LogsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    health: HealthConfig = field(default_factory=HealthConfig)

    @property
    def log_level(self) -> str:
        return self.logs.level.lower()

    @property
    def metrics_endpoint(self) -> str | None:
        return self.metrics.endpoint

    @property
    def health_window(self) -> float:
        return self.health.window


@dataclass
class LimitsConfig:
    """``service.limits``: the collector-wide bounds (per-component bounds live in their configs)."""

    max_sessions: int = 100_000
    """Sessions whose seq counter stays in memory; beyond it the least recently used is released
    (it resumes above its last seq if it comes back)."""
    max_held_requests: int = 1_000
    """Attention requests held open for an operator at once; beyond it a request is not held
    (the agent gets its neutral reply at once and the request says ``respond_via: ["oob"]``)."""
    max_remembered_commands: int = 10_000
    """Command ids remembered for dedupe and byte-identical re-acks (oldest forgotten first)."""

    def validate(self) -> None:
        for name in ("max_sessions", "max_held_requests", "max_remembered_commands"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


@dataclass
class ServiceSection:
    """``service:`` as written, built by the same coercion as every component config.

    ``pipelines`` stays raw here: it is wiring, checked against the declared components by
    ``_pipeline`` (its errors name component ids, which no type annotation can).
    """

    limits: LimitsConfig = field(default_factory=LimitsConfig)
    state_dir: str = "~/.aep"
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    pipelines: Any = None

    def validate(self) -> None:
        # Path("") is the working directory: the relay token and the epochs would land wherever
        # the collector was started, while the operator commands look in ~/.aep.
        no_folder(self.state_dir, "state_dir")


def no_folder(value: str, key: str) -> None:
    """Raise ``ValueError`` naming ``key`` if a folder setting is blank (``${env:VAR}`` set but empty)."""
    if not value.strip():
        raise ValueError(f"{key} is empty: it must name a folder (an environment variable set but empty?)")


@dataclass
class ServiceConfig:
    """A validated config: typed component configs plus the pipeline wiring."""

    file: str
    receivers: dict[str, tuple[Factory, Any]] = field(default_factory=dict)
    processors: dict[str, tuple[Factory, Any]] = field(default_factory=dict)
    exporters: dict[str, tuple[Factory, Any]] = field(default_factory=dict)
    pipelines: dict[str, PipelineSpec] = field(default_factory=dict)
    state_dir: Path = field(default_factory=lambda: Path("~/.aep").expanduser())
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    sending_queues: dict[str, Any] = field(default_factory=dict)
    """``exporters.<id>.sending_queue`` as given, per exporter id (``SendingQueueConfig``); an
    exporter without one gets the defaults (on)."""
    warnings: list[str] = field(default_factory=list)

    def components(self, kind: Kind) -> dict[str, tuple[Factory, Any]]:
        return {Kind.RECEIVER: self.receivers, Kind.PROCESSOR: self.processors,
                Kind.EXPORTER: self.exporters}[kind]


def substitute_env(value: Any, file: str, path: str, env: typing.Mapping[str, str]) -> Any:
    """Expand ``${env:VAR}`` and ``${env:VAR:-default}`` in every string; ``$$`` is a literal ``$``."""
    if isinstance(value, str):
        def repl(m: re.Match[str]) -> str:
            if m.group(0) == "$$":
                return "$"
            if m.group(3) is not None:
                if "${" in m.group(3):
                    raise ConfigError(file, path, f"substitutions do not nest (${{{m.group(3)}...}}): "
                                      "a default is literal text; $$ writes a literal $")
                raise ConfigError(file, path, f"unsupported substitution ${{{m.group(3)}}}: "
                                  "use ${env:VAR} or ${env:VAR:-default}")
            name, default = m.group(1), m.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default.replace("$$", "$")
            raise ConfigError(file, path, f"environment variable {name} is not set "
                              f"(write ${{env:{name}:-default}} to give a default)")
        return _ENV.sub(repl, value)
    if isinstance(value, dict):
        return {k: substitute_env(v, file, _join(path, str(k)), env) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute_env(v, file, f"{path}[{i}]", env) for i, v in enumerate(value)]
    return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}.get(tp, str(tp))


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {value!r}"
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def coerce(tp: Any, value: Any, file: str, path: str) -> Any:
    """Check ``value`` against the annotation ``tp``; build nested dataclasses."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        real = [a for a in args if a is not type(None)]
        if len(real) == 1:  # Optional[X]: X's own error is the precise one (e.g. a nested unknown key)
            return coerce(real[0], value, file, path)
        for arg in real:
            try:
                return coerce(arg, value, file, path)
            except ConfigError:
                continue
        raise ConfigError(file, path, f"expected {_type_name(tp)}, got {_describe(value)}")
    if origin is typing.Literal:
        if value in typing.get_args(tp) and not isinstance(value, bool):
            return value
        raise ConfigError(file, path, f"expected {_type_name(tp)}, got {_describe(value)}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(file, path, f"expected {_type_name(tp)}, got {_describe(value)}")
        (item,) = typing.get_args(tp)
        errs, items = _Collect(), []
        for i, v in enumerate(value):
            with errs.check():
                items.append(coerce(item, v, file, f"{path}[{i}]"))
        errs.done()
        return items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(file, path, f"expected a mapping, got {_describe(value)}")
        _, vt = typing.get_args(tp)
        errs, out = _Collect(), {}
        for k, v in value.items():
            with errs.check():
                out[str(k)] = coerce(vt, v, file, _join(path, str(k)))
        errs.done()
        return out
    if dataclasses.is_dataclass(tp):
        return build_dataclass(tp, value, file, path)  # type: ignore[arg-type]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str):  # what ${env:FLAG:-0} substitutes to: 1/0, true/false, yes/no, on/off
            word = value.strip().lower()
            if word in _TRUE:
                return True
            if word in _FALSE:
                return False
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):  # what ${env:N:-10000} substitutes to
            return int(value)
    elif tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value) if not isinstance(value, int) or abs(value) < 2**1023 else math.inf
        elif isinstance(value, str) and _NUMBER.fullmatch(value):  # what ${env:T:-1.5} substitutes to
            number = float(value)
        if number is not None and math.isfinite(number):
            return number
        if number is not None:  # .inf, .nan, 1e999: passed every "must be positive" and broke later
            raise ConfigError(file, path, f"expected a finite number, got {_describe(value)}")
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        return value
    raise ConfigError(file, path, f"expected {_type_name(tp)}, got {_describe(value)}")


def build_dataclass(cls: type, raw: Any, file: str, path: str) -> Any:
    """Build config dataclass ``cls`` from a YAML mapping; unknown keys are errors, not ignored.

    Key and type errors do not hide value errors: the dataclass is built from the keys that did
    coerce and its ``validate()`` still runs (see ``_value_errors``), so one run lists them all.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(file, path, f"expected a mapping, got {_describe(raw)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    errs = _Collect()
    known = ", ".join(sorted(fields)) or "none"
    for key in map(str, raw):  # in file order, every one of them
        if key not in fields:
            errs.add(file, _join(path, key), f"unknown key (known keys: {known})")
    kwargs = {}
    failed: set[str] = set()
    for name in fields:
        if name in raw:
            with errs.check():
                kwargs[name] = coerce(hints[name], raw[name], file, _join(path, name))
            if name not in kwargs:
                failed.add(name)
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        if not errs.errors:  # else most likely fallout of a key that failed (e.g. a required one)
            errs.add(file, path, str(exc))
        errs.done()
        raise AssertionError("unreachable") from None  # done() raised
    errs.errors.extend(_value_errors(obj, {str(k) for k in raw} - failed, failed, file, path))
    errs.done()
    return obj


def _value_errors(obj: Any, written: set[str], failed: set[str], file: str, path: str) -> list[ConfigError]:
    """Every problem ``obj.validate()`` finds, each at its key path where the message names a key.

    ``validate()`` may raise one ``ValueError`` (its message starting with the key, the plug-in
    contract), a ``ConfigError`` (its ``path`` relative to ``obj``), or an ``ExceptionGroup`` of
    them for several problems at once. One that stops at its first problem is called again with
    that key set back to its default, so the next problem shows too; an error after such a reset
    is reported only if it is about another key the file wrote and does not mention a key set
    back (``hi must be at least lo`` after ``lo`` was), since it may be fallout of the default
    standing in for the file's value.
    """
    validate = getattr(obj, "validate", None)
    if not callable(validate):
        return []
    fields = {f.name: f for f in dataclasses.fields(obj) if f.init}
    out: list[ConfigError] = []
    reset: set[str] = set()

    def report(problems: list[BaseException]) -> None:
        stand_ins = reset | failed  # keys holding their default in place of what the file wrote
        for problem in problems:
            key = _key_of(problem, fields)
            if key in stand_ins or _mentions(problem, stand_ins):
                continue  # judged against a stand-in: maybe fallout, not the file's problem
            if not stand_ins or key in written:
                out.extend(_as_errors(problem, fields, file, path))

    while True:
        try:
            validate()
            return out
        except ExceptionGroup as group:  # validate() listed every problem itself
            leaves = _leaves(group)
            bugs = [e for e in leaves if not isinstance(e, ValueError)]
            if bugs:
                return out + _check_failed(bugs[0], reset | failed, file, path)
            report(leaves)
            return out
        except ValueError as exc:
            if isinstance(exc, ConfigError) and len(exc.errors) > 1:  # a list too
                report(list(exc.errors))
                return out
            report([exc])
            key = _key_of(exc, fields)
            if key is None or key in reset or key in failed:
                return out
            default = _default_of(fields[key])
            if default is dataclasses.MISSING:
                return out
            reset.add(key)
            try:
                obj = dataclasses.replace(obj, **{key: default})
            except (TypeError, ValueError):
                return out
            validate = obj.validate
        except Exception as exc:  # not a finding but a bug of validate() (a plug-in's, say)
            return out + _check_failed(exc, reset | failed, file, path)


def _check_failed(exc: BaseException, stand_ins: set[str], file: str, path: str) -> list[ConfigError]:
    """A ``validate()`` that crashed, as one error at the component (not a traceback); none if it
    crashed on a default standing in for a value already reported."""
    if stand_ins:
        return []
    return [ConfigError(file, path, f"its config check failed: {type(exc).__name__}: {exc}")]


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    return [leaf for e in group.exceptions
            for leaf in (_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])]


def _mentions(exc: BaseException, keys: set[str]) -> bool:
    text = exc.message if isinstance(exc, ConfigError) else str(exc)
    return any(re.search(rf"\b{re.escape(key)}\b", text) for key in keys)


def _key_of(exc: BaseException, fields: typing.Mapping[str, Any]) -> str | None:
    """The key a validate() error is about: a ConfigError's path head, else the message's first word."""
    if isinstance(exc, ConfigError):
        head = re.split(r"[.\[]", exc.path, maxsplit=1)[0]
    else:
        m = _LEADING_KEY.match(str(exc))
        head = m.group(0) if m else ""
    return head if head in fields else None


def _as_errors(exc: BaseException, fields: typing.Mapping[str, Any], file: str, path: str) -> list[ConfigError]:
    if isinstance(exc, ConfigError):  # a nested check that already knows its key
        return [ConfigError(file, _join(path, e.path), e.message) for e in exc.errors]
    key = _key_of(exc, fields)
    return [ConfigError(file, _join(path, key) if key else path, str(exc))]


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def load_yaml(path: str | Path) -> Any:
    """Read a config file: UTF-8 YAML whose mapping keys are unique at every depth."""
    file = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(file, "", f"cannot read config: {exc.strerror or exc}") from None
    text = _decode(data, file)
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:  # raised while the loader checks the characters
        raise ConfigError(file, "", f"not valid YAML: {_yaml_problem(exc, text)}") from None
    loader.name = file
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        errs = _Collect()
        for key_path, first, again in _duplicate_keys(node):
            errs.add(file, key_path, f"duplicate key ({first}, again at {again}): keys must be "
                                     "unique; the later one would silently replace the first")
        errs.done()
        try:
            return loader.construct_document(node)
        except (ValueError, OverflowError) as exc:  # a date or number PyYAML cannot build: 2026-02-30
            raise ConfigError(file, "", f"not valid YAML: {_unbuildable(loader, node, exc)}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(file, "", f"not valid YAML: {_yaml_problem(exc, text)}") from None
    finally:
        loader.dispose()


_SCALAR_KINDS = {"tag:yaml.org,2002:timestamp": "a date", "tag:yaml.org,2002:int": "an integer",
                 "tag:yaml.org,2002:float": "a number"}


def _unbuildable(loader: yaml.SafeLoader, root: yaml.Node, exc: Exception) -> str:
    """Where the plain scalar is that YAML reads as a date or number but cannot build, and why."""
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode) and node.tag in _SCALAR_KINDS:
            try:
                loader.yaml_constructors[node.tag](loader, node)
            except (ValueError, OverflowError) as bad:
                m = node.start_mark
                shown = node.value if len(node.value) <= 40 else node.value[:40] + "..."
                return (f"line {m.line + 1}, column {m.column + 1}: {shown} reads as "
                        f"{_SCALAR_KINDS[node.tag]} and is not one ({bad}); quote it if it is text")
        elif isinstance(node, yaml.MappingNode):
            stack.extend(n for pair in reversed(node.value) for n in reversed(pair))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(reversed(node.value))
    return str(exc)


def _decode(data: bytes, file: str) -> str:
    """The text of a config file, which must be UTF-8 (a UTF-8 byte order mark is allowed)."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError(file, "", "the file is UTF-16 (it starts with a UTF-16 byte order mark); "
                                    "save it as UTF-8")
    if b"\x00" in data:  # valid UTF-8, but YAML would only say "unacceptable character #x0000"
        raise ConfigError(file, "", "the file contains NUL bytes (UTF-16 without a byte order mark?); "
                                    "save it as UTF-8")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(file, "", f"not UTF-8: byte 0x{data[exc.start]:02x} at line {line}, column {column} "
                                    f"({exc.reason}); save the file as UTF-8") from None


def _yaml_problem(exc: yaml.YAMLError, text: str) -> str:
    """One line saying what PyYAML found and where (its own message spans several)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        m = exc.problem_mark
        where = f"line {m.line + 1}, column {m.column + 1}: {exc.problem}"
        if exc.context and exc.context_mark is not None:
            c = exc.context_mark
            where += f" ({exc.context} at line {c.line + 1}, column {c.column + 1})"
        return where
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        return f"line {line}, column {column}: unacceptable character #x{exc.character:04x} ({exc.reason})"
    return " ".join(str(exc).split())


def _duplicate_keys(root: yaml.Node) -> Iterator[tuple[str, str, str]]:
    """``(key path, where first, where again)`` of each mapping key written twice, at any depth.

    PyYAML keeps the last of repeated keys silently; a second ``processors:`` section could then
    raise the capture ceiling unnoticed. ``<<`` merge keys may be overridden, as YAML intends.
    """
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    seen: set[int] = set()  # an alias is the same node: walk it once
    found: list[tuple[str, yaml.Mark, yaml.Mark]] = []
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], yaml.Mark] = {}
            children = []
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                    continue
                here = key.start_mark
                if (key.tag, key.value) in first:
                    found.append((_join(path, key.value), first[(key.tag, key.value)], here))
                else:
                    first[(key.tag, key.value)] = here
                children.append((value, _join(path, key.value)))
            stack.extend(reversed(children))  # popped in file order: an anchor is met before its aliases
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(reversed([(item, f"{path}[{i}]") for i, item in enumerate(node.value)]))
    for key_path, a, b in sorted(found, key=lambda f: (f[2].line, f[2].column)):
        if a.line == b.line:
            yield key_path, f"line {a.line + 1}, column {a.column + 1}", f"column {b.column + 1}"
        else:
            yield key_path, f"line {a.line + 1}", f"line {b.line + 1}"


def parse(raw: Any, registry: Registry, file: str = "<config>",
          env: typing.Mapping[str, str] | None = None) -> ServiceConfig:
    """Validate a loaded YAML document into a ``ServiceConfig``; every problem is reported at once."""
    env = os.environ if env is None else env
    if raw is None:
        raise ConfigError(file, "", "the config is empty: it needs receivers, exporters and service.pipelines")
    if not isinstance(raw, dict):
        raise ConfigError(file, "", f"expected a mapping at the top level, got {_describe(raw)}")
    errs = _Collect()
    raw = _substitute_each(raw, file, "", env, errs)
    spoiled = [e.path for e in errs.errors]  # keys whose ${env:...} failed: their later errors are noise
    for key in raw:
        if key not in {"receivers", "processors", "exporters", "service"}:
            errs.add(file, str(key), "unknown top-level key (expected receivers, processors, exporters, service)")
    cfg = ServiceConfig(file=file)
    declared = _components(cfg, registry, raw, file, errs)
    service = raw.get("service")
    if not isinstance(service, dict):
        errs.add(file, "service", "missing: the config needs service.pipelines")
        errs.done()
        raise AssertionError("unreachable")  # done() raised
    with errs.check():
        section = build_dataclass(ServiceSection, service, file, "service")
        cfg.limits, cfg.telemetry = section.limits, section.telemetry
        cfg.state_dir = Path(section.state_dir).expanduser()
    pipelines = service.get("pipelines")
    if not isinstance(pipelines, dict) or not pipelines:
        errs.add(file, "service.pipelines", "expected at least one pipeline")
        pipelines = {}
    used: set[tuple[Kind, str]] = set()
    for name, spec in pipelines.items():
        with errs.check():
            cfg.pipelines[str(name)] = _pipeline(cfg, str(name), spec, declared, used, file)
    errs.errors.extend(_delivered_twice(cfg, file))
    errs.errors.extend(_shared_ports(cfg, used, file))
    n = len(spoiled)  # the substitution errors come first; what they spoiled later is noise
    errs.errors = errs.errors[:n] + [e for e in errs.errors[n:] if not any(_under(e.path, p) for p in spoiled)]
    errs.done()
    cfg.warnings.extend(_warnings(cfg, used))
    return cfg


def _components(cfg: ServiceConfig, registry: Registry, raw: dict[str, Any], file: str,
                errs: _Collect) -> set[tuple[Kind, str]]:
    """Build every component section into ``cfg``; returns the ids written in the file, built or not."""
    declared: set[tuple[Kind, str]] = set()
    for kind in Kind:
        section = raw.get(kind.plural) or {}
        if not isinstance(section, dict):
            errs.add(file, kind.plural, f"expected a mapping of component ids, got {_describe(section)}")
            continue
        for cid, body in section.items():
            cid = str(cid)
            declared.add((kind, cid))
            with errs.check():
                cfg.components(kind)[cid] = _component(cfg, registry, kind, cid, body, file)
    return declared


def _delivered_twice(cfg: ServiceConfig, file: str) -> list[ConfigError]:
    """An exporter two pipelines reach from one receiver: an error at the later pipeline's entry.

    Each pipeline maps and stamps what the receiver sends on its own, so the exporter got every
    moment twice, as two events with their own ids and seqs: a session file with two
    ``session.started``, a stream AEP's rules call invalid.
    """
    first: dict[tuple[str, str], str] = {}
    out = []
    for pname, spec in cfg.pipelines.items():
        for i, eid in enumerate(spec.exporters):
            shared = next((rid for rid in spec.receivers if (rid, eid) in first), None)
            if shared is not None:
                out.append(ConfigError(file, f"service.pipelines.{pname}.exporters[{i}]",
                                       f"exporter {eid!r} already gets what receiver {shared} sends, through "
                                       f"pipeline {first[(shared, eid)]}: every event would reach it twice, under two ids "
                                       "(a session started twice); give one pipeline its own exporter"))
            for rid in spec.receivers:
                first.setdefault((rid, eid), pname)
    return out


_ANY_HOST = frozenset({"", "0.0.0.0", "::", "*"})
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


def _same_address(a: str, b: str) -> bool:
    """Whether binding hosts ``a`` and ``b`` on one port would collide."""
    return a == b or a in _ANY_HOST or b in _ANY_HOST or ("localhost" in (a, b) and {a, b} <= _LOOPBACK)


def _shared_ports(cfg: ServiceConfig, used: set[tuple[Kind, str]], file: str) -> list[ConfigError]:
    """Two listeners of this config on one port: an error at the later one, naming the earlier.

    Each would start alone, and together the second failed at start with a bare "address already
    in use". A component config says where it listens with ``listens()`` (key -> ``host:port``);
    port 0 (any free port) never collides, and an endpoint that does not parse is reported by its
    own component.
    """
    listeners = [(f"{kind.plural}.{cid}.{key}", endpoint)
                 for kind in Kind for cid, (_, ccfg) in cfg.components(kind).items() if (kind, cid) in used
                 for key, endpoint in _listens(ccfg).items() if isinstance(endpoint, str)]
    if cfg.telemetry.metrics_endpoint:
        listeners.append(("service.telemetry.metrics.endpoint", cfg.telemetry.metrics_endpoint))
    seen: list[tuple[str, str, int]] = []
    out = []
    for where, endpoint in listeners:
        try:
            host, port = parse_endpoint(endpoint)
        except ConfigError:
            continue
        host = host.lower()
        other = next((w for w, h, p in seen if p == port and _same_address(h, host)), None)
        if port and other:
            out.append(ConfigError(file, where, f"{endpoint}: {other} listens on this port too; "
                                                "give each listener its own port"))
        seen.append((where, host, port))
    return out


def _listens(ccfg: Any) -> dict[str, Any]:
    listens = getattr(ccfg, "listens", None)
    try:
        found = listens() if callable(listens) else {}
    except Exception:  # a plug-in's bug: its own start reports the port, named, if it is taken
        return {}
    return found if isinstance(found, dict) else {}


def _warnings(cfg: ServiceConfig, used: set[tuple[Kind, str]]) -> list[str]:
    """What a valid config still gets told: an ungated pipeline end, components no pipeline uses."""
    out = []
    for pname, spec in cfg.pipelines.items():
        procs = spec.processors
        if not procs or cfg.processors[procs[-1]][0].type != "capture":
            out.append(
                f"{cfg.file}: service.pipelines.{pname}.processors: does not end with a capture processor; "
                "one is appended (the pipeline's last capture config, else the metadata default) so "
                "nothing leaves it ungated")
    for kind in Kind:
        for cid in cfg.components(kind):
            if (kind, cid) not in used:
                out.append(f"{cfg.file}: {kind.plural}.{cid}: defined but not used in any pipeline")
    return out


def _substitute_each(value: Any, file: str, path: str, env: typing.Mapping[str, str], errs: _Collect) -> Any:
    """``substitute_env`` leaf by leaf: a failed leaf is reported and kept as written."""
    if isinstance(value, dict):
        return {k: _substitute_each(v, file, _join(path, str(k)), env, errs) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute_each(v, file, f"{path}[{i}]", env, errs) for i, v in enumerate(value)]
    with errs.check():
        return substitute_env(value, file, path, env)
    return value


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".") or path.startswith(prefix + "[")


def _component(cfg: ServiceConfig, registry: Registry, kind: Kind, cid: str, body: Any,
               file: str) -> tuple[Factory, Any]:
    where = f"{kind.plural}.{cid}"
    if not ID_PATTERN.match(cid):
        raise ConfigError(file, where, "a component id is 'type' or 'type/name' "
                          "(type: lowercase letters, digits, underscores)")
    type_name = cid.split("/", 1)[0]
    factory = registry.get(kind, type_name)
    if factory is None:
        known = ", ".join(registry.types(kind)) or "none"
        raise ConfigError(file, where, f"unknown {kind.value} type {type_name!r} (known: {known})")
    errs = _Collect()
    if kind is Kind.EXPORTER and isinstance(body, dict) and "sending_queue" in body \
            and not _has_field(factory.config_class, "sending_queue"):
        # The service's, not the exporter's: every queued exporter takes the same block.
        from .sending_queue import SendingQueueConfig

        body = dict(body)
        queue = body.pop("sending_queue")
        with errs.check():
            cfg.sending_queues[cid] = build_dataclass(SendingQueueConfig, queue, file, f"{where}.sending_queue")
    built = None
    with errs.check():
        built = build_dataclass(factory.config_class, body, file, where)
    errs.done()
    return factory, built


def _has_field(cls: type, name: str) -> bool:
    return dataclasses.is_dataclass(cls) and any(f.name == name for f in dataclasses.fields(cls))


def _pipeline(cfg: ServiceConfig, name: str, spec: Any, declared: set[tuple[Kind, str]],
              used: set[tuple[Kind, str]], file: str) -> PipelineSpec:
    where = f"service.pipelines.{name}"
    if not isinstance(spec, dict):
        raise ConfigError(file, where, f"expected a mapping, got {_describe(spec)}")
    errs = _Collect()
    for key in spec:
        if key not in ("receivers", "processors", "exporters"):
            errs.add(file, f"{where}.{key}", "unknown key (known keys: receivers, processors, exporters)")
    lists: dict[str, list[str]] = {}
    for kind in Kind:
        ids = spec.get(kind.plural, [])
        if ids is None:
            ids = []
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            errs.add(file, f"{where}.{kind.plural}", "expected a list of component ids")
            lists[kind.plural] = []
            continue
        for i, cid in enumerate(ids):
            if cid not in cfg.components(kind) and (kind, cid) not in declared:
                errs.add(file, f"{where}.{kind.plural}[{i}]", f"{kind.value} {cid!r} is not defined under {kind.plural}:")
            used.add((kind, cid))
        if len(set(ids)) != len(ids):
            errs.add(file, f"{where}.{kind.plural}", "a component is listed twice")
        lists[kind.plural] = ids
    if not lists["receivers"] and isinstance(spec.get("receivers", []), list | None):
        errs.add(file, f"{where}.receivers", "a pipeline needs at least one receiver")
    if not lists["exporters"] and isinstance(spec.get("exporters", []), list | None):
        errs.add(file, f"{where}.exporters", "a pipeline needs at least one exporter")
    signals = [r for r in lists["receivers"]
               if r in cfg.receivers and cfg.receivers[r][0].emits_signals]
    mapped = any(p in cfg.processors and cfg.processors[p][0].type == MAPPING_TYPE for p in lists["processors"])
    unbuilt = any(p not in cfg.processors for p in lists["processors"])  # unknown: reported already
    if signals and not mapped and not unbuilt:
        # Nothing else turns a vendor's hook call into events: at runtime every one would be dropped.
        errs.add(file, f"{where}.processors",
                 f"receiver(s) {', '.join(signals)} deliver vendor signals (hook calls, log records) "
                 f"that only a '{MAPPING_TYPE}' processor turns into events, and this pipeline has none: "
                 f"every one would be dropped; add it (e.g. [{MAPPING_TYPE}, runs, capture])")
    errs.done()
    return PipelineSpec(name, lists["receivers"], lists["processors"], lists["exporters"])


def load(path: str | Path, registry: Registry, env: typing.Mapping[str, str] | None = None) -> ServiceConfig:
    """Read, substitute and validate a pipeline config file."""
    return parse(load_yaml(path), registry, str(path), env)


def parse_endpoint(endpoint: str, file: str = "<config>", path: str = "endpoint") -> tuple[str, int]:
    """``host:port`` (IPv6 as ``[::1]:port``) -> ``(host, port)``; port 0 means any free port."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]]+):(\d+)", endpoint)
    if not m:
        raise ConfigError(file, path, f"expected host:port, got {endpoint!r}")
    host = m.group(1) or m.group(3)
    port = int(m.group(2) or m.group(4))
    if not 0 <= port <= 65535:
        raise ConfigError(file, path, f"port {port} is out of range")
    return host, port
