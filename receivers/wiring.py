"""``aep-collector hooks VENDOR [--install | --uninstall] [--dry-run] [--home DIR]``.

A vendor's registration is a ``Wiring``: the files the vendor reads (``Target``), each either
merged into the vendor's own config (JSON/JSONC, YAML, TOML) or owned whole (a plugin, an
extension, a hook script), plus advice for the operator (trust steps, environment). Printing
shows the first target's content exactly as the file would hold it; installing merges every
target, keeps ``<file>.aep-backup`` of what it replaced, and records what it wrote in
``<hook dir>/installed/VENDOR.json`` so that uninstalling removes exactly that:

- a file unchanged since the install is restored byte for byte from its backup (or removed, if
  the install created it);
- a file edited since loses only the entries the record names (list items equal to ours, scalars
  reset to what they were), everything else kept.

Installing twice writes the same bytes (so a vendor that fingerprints its hooks, like Codex,
keeps its trust). Entries that carry the shim's file name are recognised as ours even without a
record (a block pasted by hand, a lost record), so they are replaced, never duplicated.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aep_collector.pipeline.atomic import atomic_write
from aep_collector.receivers.registration import HOOK_FILE, hook_dir

BACKUP_SUFFIX = ".aep-backup"
BEGIN = "# >>> aep-collector (remove with: aep-collector hooks {vendor} --uninstall) >>>"
END = "# <<< aep-collector <<<"
MARK = "# >>> aep-collector ("
_ABSENT = {"aep-collector": "absent"}  # a scalar that was not there before the install


class WiringError(Exception):
    """A file cannot be merged safely (it does not parse, or a key has another shape)."""


@dataclass
class Target:
    """One file the vendor reads.

    ``base`` says where ``path`` is relative to: ``home``, ``project`` (the current directory or
    ``--project``), or an environment variable the vendor honours with its default under home
    (``CODEX_HOME:.codex``). ``kind``: ``json`` / ``yaml`` merge ``data`` into the file; ``toml``
    appends ``text`` as a marked block; ``file`` owns the whole file (``text``, ``mode``).
    """

    path: str
    kind: str
    text: str
    data: Any = None
    base: str = "home"
    mode: int | None = None


@dataclass
class Wiring:
    """A vendor's registration. ``advice[0]`` says where the printed file goes (and that
    ``--install`` puts it there); the rest (trust steps, environment) holds for an install too."""

    vendor: str
    targets: list[Target]
    advice: list[str] = field(default_factory=list)

    def text(self) -> str:
        """What ``hooks VENDOR`` prints: the first target's content, exactly as the file holds it."""
        return self.targets[0].text


def json_target(path: str, data: dict[str, Any], base: str = "home") -> Target:
    return Target(path, "json", json.dumps(data, indent=2) + "\n", data, base)


def resolve(target: Target, home: Path | None, project: Path | None) -> Path:
    """The absolute path of ``target``: under ``--home`` when given, else the vendor's own rules."""
    name, _, default = target.base.partition(":")
    if name == "project":
        return (project or Path.cwd()) / target.path
    if name == "home":
        return (home or Path.home()) / target.path
    env = os.environ.get(name) if home is None else None  # --home: a scratch home, the vendor's defaults
    return (Path(env) if env else (home or Path.home()) / default) / target.path


# --- parsing and dumping -------------------------------------------------------------------------------


_JSONC_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|//[^\n]*|/\*.*?\*/|,(?=\s*[}\]])', re.S)


def strip_jsonc(text: str) -> str:
    """JSONC to JSON: comments and trailing commas out, strings untouched."""
    return _JSONC_TOKEN.sub(lambda m: m.group(0) if m.group(0).startswith('"') else "", text)


def load(kind: str, text: str, path: Path) -> tuple[dict[str, Any], list[str]]:
    """The file's data (``{}`` when empty) and notes (comments that a rewrite drops)."""
    notes: list[str] = []
    if not text.strip():
        return {}, notes
    try:
        if kind == "json":
            try:
                data = json.loads(text)
            except json.JSONDecodeError:
                data = json.loads(strip_jsonc(text))
                notes.append(f"{path}: its comments are not kept by the rewrite (the backup has them)")
        elif kind == "toml":
            data = tomllib.loads(text)
        else:
            data = yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise WiringError(f"{path} does not parse as {kind.upper()}: {exc}; nothing was changed") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise WiringError(f"{path}: the top level is not a mapping; nothing was changed")
    return data, notes


def dump(kind: str, data: dict[str, Any]) -> str:
    if kind == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1 << 16)


# --- merging --------------------------------------------------------------------------------------------


HANDLER_NAME = "aep-collector"
"""The ``name`` of the hook handlers this tool writes where the vendor's format has one (Gemini
CLI, Qwen Code): how a native ``http`` handler, which names no shim file, is known as ours."""


def ours(item: Any) -> bool:
    """An entry this tool wrote: it runs the shim copy (commands name its file), or one of its
    handlers carries our ``name`` (a pasted block or a lost install record must not leave an old
    URL beside the new one, posting every hook twice)."""
    if isinstance(item, dict):
        handlers = item.get("hooks")
        if isinstance(handlers, list) and any(isinstance(h, dict) and h.get("name") == HANDLER_NAME
                                               for h in handlers):
            return True
    return HOOK_FILE in json.dumps(item)


def merge(data: dict[str, Any], fragment: dict[str, Any], where: str = "") -> dict[str, Any]:
    """Merge ``fragment`` into ``data`` in place; return the scalars' previous values by dotted key.

    Lists get our items appended after dropping equal items and items that are ``ours`` (so a
    repeat install replaces, never duplicates); mappings merge key by key; scalars are set.
    """
    previous: dict[str, Any] = {}
    for key, value in fragment.items():
        here = f"{where}.{key}" if where else key
        if isinstance(value, dict):
            node = data.setdefault(key, {})
            if not isinstance(node, dict):
                raise WiringError(f"{here} is a {type(node).__name__} in the file, a mapping is expected")
            previous.update(merge(node, value, here))
        elif isinstance(value, list):
            node = data.setdefault(key, [])
            if not isinstance(node, list):
                raise WiringError(f"{here} is a {type(node).__name__} in the file, a list is expected")
            node[:] = [x for x in node if x not in value and not ours(x)] + value
        else:
            previous[here] = data.get(key, _ABSENT)
            data[key] = value
    return previous


def unmerge(data: dict[str, Any], fragment: dict[str, Any], previous: dict[str, Any], where: str = "") -> None:
    """Undo ``merge``: drop our list items, restore scalars, prune what became empty."""
    for key, value in fragment.items():
        here = f"{where}.{key}" if where else key
        if key not in data:
            continue
        node = data[key]
        if isinstance(value, dict) and isinstance(node, dict):
            unmerge(node, value, previous, here)
            if not node:
                del data[key]
        elif isinstance(value, list) and isinstance(node, list):
            node[:] = [x for x in node if x not in value and not ours(x)]
            if not node:
                del data[key]
        elif here in previous:
            if previous[here] == _ABSENT:
                del data[key]
            else:
                data[key] = previous[here]


def strip_block(text: str) -> str:
    """``text`` without our marked block (and the blank line that set it off)."""
    pattern = re.compile(r"\n?# >>> aep-collector \(.*?\n# <<< aep-collector <<<\n?", re.S)
    return pattern.sub("\n", text).rstrip("\n") + "\n" if pattern.search(text) else text


def with_block(vendor: str, text: str, block: str) -> str:
    base = strip_block(text).rstrip("\n")
    marked = f"{BEGIN.format(vendor=vendor)}\n{block.rstrip(chr(10))}\n{END}\n"
    return f"{base}\n\n{marked}" if base else marked


# --- install / uninstall ----------------------------------------------------------------------------------


def records_dir() -> Path:
    return hook_dir() / "installed"


def _read_record(vendor: str) -> dict[str, Any] | None:
    path = records_dir() / f"{vendor}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write(path: Path, text: str, mode: int | None) -> None:
    if path.is_symlink():  # a dotfile kept elsewhere (stow, a dotfiles repo): write through the link
        path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text, mode=mode)  # an existing file keeps its mode unless one is given


@dataclass
class Change:
    path: Path
    action: str  # created, updated, unchanged, restored, removed, cleaned, kept
    before: str
    after: str | None
    notes: list[str] = field(default_factory=list)

    def line(self, dry_run: bool) -> str:
        verb = {"created": "create", "updated": "update", "restored": "restore", "removed": "remove",
                "cleaned": "remove our entries from"}.get(self.action)
        if dry_run and verb:
            return f"would {verb} {self.path}"
        return f"{self.action} {self.path}"

    def diff(self) -> str:
        return "".join(difflib.unified_diff(self.before.splitlines(True), (self.after or "").splitlines(True),
                                            f"{self.path} (now)", f"{self.path} (after)"))


def _new_text(vendor: str, target: Target, path: Path, current: str, old: dict[str, Any] | None,
              notes: list[str]) -> tuple[str, dict[str, Any]]:
    """The file's content with our part (re)applied, and what the record keeps to undo it."""
    if target.kind == "file":
        return target.text, {}
    if target.kind == "toml":
        result = with_block(vendor, current, target.text)
        load("toml", result, path)  # refuse to write a file the vendor cannot read
        return result, {}
    if target.kind == "yaml":
        base = strip_block(current) if MARK in current else current
        if not any(k in load("yaml", base, path)[0] for k in target.data):
            # Nothing of the user's to merge with: append our block and keep their text (comments too).
            result = with_block(vendor, base, target.text)
            load("yaml", result, path)
            return result, {"fragment": target.data, "previous": {}}
    data, parse_notes = load(target.kind, current, path)
    if old and old.get("fragment") is not None:
        unmerge(data, old["fragment"], old.get("previous", {}))
    notes.extend(parse_notes)
    if target.kind == "yaml" and current.strip():
        notes.append(f"{path}: rewritten by the YAML dumper (comments dropped; the backup has them)")
    previous = merge(data, target.data)
    return dump(target.kind, data), {"fragment": target.data, "previous": previous}


def install(wiring: Wiring, home: Path | None = None, project: Path | None = None,
            dry_run: bool = False) -> list[Change]:
    """Merge every target of ``wiring``; write the record; return what changed (nothing when dry)."""
    record = _read_record(wiring.vendor) or {}
    old_by_path = {t["path"]: t for t in record.get("targets", [])}
    changes: list[Change] = []
    planned: list[tuple[Target, Path, str, str, dict[str, Any]]] = []
    for target in wiring.targets:  # plan all before writing any: a refusal leaves every file as it was
        path = resolve(target, home, project)
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        notes: list[str] = []
        new, undo = _new_text(wiring.vendor, target, path, current, old_by_path.get(str(path)), notes)
        if path.exists() and target.kind == "file" and current != new and str(path) not in old_by_path:
            notes.append(f"{path}: an existing file is replaced (the backup keeps it)")
        planned.append((target, path, current, new, undo))
        action = "unchanged" if path.exists() and current == new else ("updated" if path.exists() else "created")
        changes.append(Change(path, action, current, new, notes))
    if dry_run:
        return changes
    entries = []
    for (target, path, _current, new, undo), change in zip(planned, changes, strict=True):
        old = old_by_path.get(str(path))
        existed = old["existed"] if old else path.exists()
        backup = Path(old["backup"]) if old and old.get("backup") else None
        if old is None and path.exists():
            backup = path.with_name(path.name + BACKUP_SUFFIX)
            backup.write_bytes(path.read_bytes())
        if change.action != "unchanged":
            _write(path, new, target.mode)
        entries.append({"path": str(path), "kind": target.kind, "existed": existed,
                        "backup": str(backup) if backup else None, "sha256": _sha(new.encode("utf-8")), **undo})
    for path_text, old in old_by_path.items():  # a target this version no longer writes
        if path_text not in {e["path"] for e in entries}:
            changes.append(_undo(wiring.vendor, old))
    records_dir().mkdir(parents=True, exist_ok=True)
    (records_dir() / f"{wiring.vendor}.json").write_text(
        json.dumps({"vendor": wiring.vendor, "targets": entries}, indent=2) + "\n", encoding="utf-8")
    return changes


def _undo(vendor: str, entry: dict[str, Any], dry_run: bool = False) -> Change:
    path = Path(entry["path"])
    if not path.exists():
        return Change(path, "kept", "", None, [f"{path}: already gone"])
    current = path.read_text(encoding="utf-8")
    backup = Path(entry["backup"]) if entry.get("backup") else None
    if _sha(current.encode("utf-8")) == entry["sha256"]:  # untouched since: put back exactly what was there
        if entry["existed"] and backup is not None and backup.exists():
            before = backup.read_text(encoding="utf-8")
            if not dry_run:
                _write(path, before, None)
                backup.unlink()
            return Change(path, "restored", current, before)
        if not dry_run:
            path.resolve().unlink() if path.is_symlink() else path.unlink()
            if backup is not None and backup.exists():
                backup.unlink()
        return Change(path, "removed", current, None)
    # Edited since the install: take out only our part.
    kind = entry["kind"]
    if kind == "file":
        if current == entry.get("text"):  # no record, but exactly what we would write
            if not dry_run:
                path.unlink()
            return Change(path, "removed", current, None)
        return Change(path, "kept", current, current, [f"{path}: edited since the install; left in place"])
    if kind == "toml" or (kind == "yaml" and MARK in current):
        after = strip_block(current)
    else:
        data, _ = load(kind, current, path)
        untouched = json.dumps(data)
        unmerge(data, entry.get("fragment") or {}, entry.get("previous", {}))
        after = current if json.dumps(data) == untouched else dump(kind, data)  # nothing of ours: no rewrite
    if not dry_run and after != current:
        _write(path, after, None)
    notes = [f"{path}: edited since the install; only our entries were removed (backup kept: {backup})"
             if entry["sha256"] else f"{path}: no install record; only what is recognisably ours was removed"]
    return Change(path, "cleaned", current, after, notes)


def uninstall(vendor: str, dry_run: bool = False, unrecorded: Wiring | None = None, home: Path | None = None,
              project: Path | None = None) -> list[Change]:
    """Undo the recorded install of ``vendor``.

    Without a record (pasted by hand, record lost), ``unrecorded``'s files lose what is
    recognisably ours (entries equal to the registration's or running the shim, our marked block,
    a file whose content is exactly ours); nothing else is touched.
    """
    record = _read_record(vendor)
    if record is None:
        if unrecorded is None:
            return []
        entries = [{"path": str(resolve(t, home, project)), "kind": t.kind, "existed": True, "backup": None,
                    "sha256": "", "fragment": t.data, "previous": {}, "text": t.text} for t in unrecorded.targets]
        changes = [_undo(vendor, entry, dry_run) for entry in entries]
        return [c for c in changes if c.action == "removed" or (c.after is not None and c.after != c.before)]
    changes = [_undo(vendor, entry, dry_run) for entry in record.get("targets", [])]
    if not dry_run:
        (records_dir() / f"{vendor}.json").unlink()
    return changes
