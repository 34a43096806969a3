"""The collector's own log: secrets never reach it, and request noise is one line per cause.

``RedactingFilter`` sits on the log handler, so it sees every record of every logger (ours,
aiohttp's, websockets' handshake lines at ``debug`` with their ``Authorization`` header) at every
level, and runs the capture processor's secret detectors over the message and any traceback:
provider keys, AWS keys, JWTs, PEM blocks, ``Bearer``/``Basic`` credentials, URL passwords,
``key=value`` assignments and the configured secret values (the relay token) become
``[REDACTED:secret]``, any ``/home/<user>``, ``/Users/<user>`` or ``C:\\Users\\<user>`` becomes
``~`` and emails become ``[REDACTED:pii]``, before anything is written.

``Throttle`` is how malformed requests and client disconnects are logged: the first of each
``(component, cause)`` is one line; later ones within ``window`` seconds are only counted (in
``/metrics`` as ``aep_collector_request_errors_total``) and the next line says how many there were.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from aep_collector.processors.capture.redact import Redactor, is_credential_key


class RedactingFilter(logging.Filter):
    """Rewrites each record's message and traceback through the secret detectors (never drops one)."""

    def __init__(self, secret_values: Iterable[str] = ()) -> None:
        super().__init__()
        # Emails are redacted (a vendor's session id can be one: Kimi Code's `user@host:/path`); the
        # rest of such an id still correlates log lines. Phone numbers are not: the phone detector
        # takes timestamps, ports and counts for them, which operators need. home="": no configured
        # home beyond what rule (c) takes anyway (any `/home/<user>`, `/Users/<user>`).
        self.redactor = Redactor(secret_values, pii=True, home="", phones=False)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string is logging's to report, not ours to hide
            return True
        record.msg, record.args = self.redactor.text(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redactor.text(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redactor.text(record.stack_info)
        return True


def install(secret_values: Iterable[str] = (), logger: logging.Logger | None = None) -> RedactingFilter:
    """Put one ``RedactingFilter`` on every handler of ``logger`` (the root logger by default)."""
    target = logger or logging.getLogger()
    flt = RedactingFilter(secret_values)
    for handler in target.handlers:
        for old in [f for f in handler.filters if isinstance(f, RedactingFilter)]:
            handler.removeFilter(old)
        handler.addFilter(flt)
    return flt


def config_secrets(value: Any) -> Iterator[str]:
    """Every secret a component config holds: strings under a credential-named key (``token``,
    ``api_key``, ...) and the capture processor's ``secret_values`` / ``secret_env``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, str) and item and is_credential_key(key):
                yield item
            elif key == "secret_values" and isinstance(item, list):
                yield from (v for v in item if isinstance(v, str))
            elif key == "secret_env" and isinstance(item, list):
                yield from (os.environ[n] for n in item if isinstance(n, str) and os.environ.get(n))
            else:
                yield from config_secrets(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from config_secrets(item)


class Throttle:
    """At most one log line per ``(component, cause)`` per ``window`` seconds; the rest are counted."""

    def __init__(self, logger: logging.Logger, window: float = 60.0) -> None:
        self.logger, self.window = logger, window
        self._lock = threading.Lock()
        self._state: dict[tuple[str, str], tuple[float, int]] = {}  # -> (last line at, suppressed since)

    def __call__(self, component: str, cause: str, detail: str, level: int = logging.WARNING) -> bool:
        """Log ``component: cause: detail`` unless one was logged lately; True when a line was written."""
        now = time.monotonic()
        key = (component, cause)
        with self._lock:
            last, suppressed = self._state.get(key, (float("-inf"), 0))
            if now - last < self.window:
                self._state[key] = (last, suppressed + 1)
                return False
            self._state[key] = (now, 0)
            if len(self._state) > 4096:  # bounded: causes are a small set, components too
                self._state.pop(next(iter(self._state)))
        more = f" ({suppressed} more since the last line)" if suppressed else ""
        self.logger.log(level, "%s: %s: %s%s", component, cause, " ".join(detail.split())[:300], more)
        return True
