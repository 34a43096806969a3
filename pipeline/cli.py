"""The ``aep-collector`` command.

    aep-collector [--config FILE]               run the collector (default: the packaged config)
    aep-collector validate --config FILE        check a config, exit non-zero with the reason
    aep-collector components                    list every component type it can build
    aep-collector validate-events FILE.jsonl    check AEP events against the envelope rules
    aep-collector hooks VENDOR                  print the file the vendor reads (advice on stderr)
    aep-collector hooks VENDOR --install        merge it into the vendor's own config (--uninstall, --dry-run)

Operator commands (``pipeline/operator_cli.py``), talking to a running collector's relay role:
    aep-collector tail | timeline SESSION | pending | respond REQUEST ... | cancel RUN | status
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from .component import Kind
from .config import ConfigError, load
from .logs import config_secrets
from .logs import install as install_log_redaction

DEFAULT_CONFIG = str(Path(__file__).with_name("default.yaml"))
"""The default config ships inside the package, so ``aep-collector`` with no flags works from any folder."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aep-collector", description="Coding-agent hooks and OTLP logs in, AEP events out.")
    p.add_argument("--config", metavar="FILE", help="pipeline config to run (default: the built-in default config)")
    p.add_argument("--version", action="version", version=f"aep-collector {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    run = sub.add_parser("run", help="run the collector (the default command)")
    run.add_argument("--config", dest="run_config", metavar="FILE", help="pipeline config file")
    val = sub.add_parser("validate", help="check a pipeline config")
    val.add_argument("--config", dest="val_config", metavar="FILE", help="pipeline config file (required)")
    comp = sub.add_parser("components", help="list receiver, processor and exporter types")
    comp.add_argument("--json", action="store_true", help="print JSON with default configs")
    ev = sub.add_parser("validate-events", help="validate a JSONL file of AEP events")
    ev.add_argument("file", metavar="FILE", help="a JSONL log (its rotated and compressed parts are read too)")
    hooks = sub.add_parser("hooks", help="print, install or uninstall a vendor's hook registration")
    hooks.add_argument("vendor", metavar="VENDOR", help="e.g. claude-code, codex, gemini-cli")
    hooks.add_argument("--url", metavar="URL", help="receiver base URL (default: the vendor receiver's default endpoint)")
    hooks.add_argument("--config", dest="hooks_config", metavar="FILE", help="take endpoint and timeouts from this config")
    mode = hooks.add_mutually_exclusive_group()
    mode.add_argument("--install", action="store_true", help="merge the registration into the vendor's config")
    mode.add_argument("--uninstall", action="store_true", help="remove exactly what --install wrote")
    hooks.add_argument("--dry-run", action="store_true", help="say what --install/--uninstall would change")
    hooks.add_argument("--home", metavar="DIR", help="treat DIR as the home folder (vendor configs and ~/.aep)")
    hooks.add_argument("--project", metavar="DIR",
                       help="workspace for project-level files (default: the current folder)")
    from .operator_cli import add_commands

    add_commands(sub)
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aep-collector")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _registry() -> Any:
    from .registry import build_registry, tell

    registry, problems = build_registry()
    tell(problems, lambda problem: print(f"warning: {problem}", file=sys.stderr))
    return registry


def _print_errors(exc: ConfigError) -> None:
    for err in exc.errors:  # every problem of the file, one line each
        print(f"error: {err}", file=sys.stderr)
    if len(exc.errors) > 1:
        print(f"{exc.file}: {len(exc.errors)} errors", file=sys.stderr)


def cmd_validate(path: str) -> int:
    try:
        cfg = load(path, _registry())
    except ConfigError as exc:
        _print_errors(exc)
        return 1
    for w in cfg.warnings:
        print(f"warning: {w}", file=sys.stderr)
    n = {k: len(cfg.components(k)) for k in Kind}
    print(f"{path}: valid ({len(cfg.pipelines)} pipelines, {n[Kind.RECEIVER]} receivers, "
          f"{n[Kind.PROCESSOR]} processors, {n[Kind.EXPORTER]} exporters)")
    return 0


def cmd_components(as_json: bool) -> int:
    registry = _registry()
    if as_json:
        out: dict[str, Any] = {}
        for kind in Kind:
            out[kind.plural] = {
                t: {"description": f.description, "stability": f.stability,
                    "origin": registry.origins.get((kind, t), "builtin"),
                    "default_config": dataclasses.asdict(f.default_config())}
                for t, f in sorted(registry.factories[kind].items())
            }
        print(json.dumps(out, indent=2, default=str))
        return 0
    for kind in Kind:
        print(f"{kind.plural}:")
        for t in registry.types(kind):
            f = registry.factories[kind][t]
            origin = registry.origins.get((kind, t), "builtin")
            suffix = "" if origin == "builtin" else f"  [{origin}]"
            print(f"  {t:<14} {f.description}{suffix}")
    return 0


def cmd_run(path: str) -> int:
    from .service import Service

    try:
        cfg = load(path, _registry())
    except ConfigError as exc:
        _print_errors(exc)
        return 1
    logging.basicConfig(level=getattr(logging, cfg.telemetry.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # Never a secret in the log, at any level (websockets prints the relay's Authorization at debug).
    components = [*cfg.receivers.values(), *cfg.processors.values(), *cfg.exporters.values()]
    install_log_redaction([s for _, ccfg in components for s in config_secrets(ccfg)])
    for w in cfg.warnings:
        logging.getLogger("aep.config").warning(w)
    service = Service(cfg)
    try:
        asyncio.run(service.run_until_signalled())
    except ConfigError as exc:  # a component (a plug-in's, say) that cannot be created: named
        _print_errors(exc)
        return 1
    except OSError as exc:  # e.g. the port is taken: say which, exit non-zero
        print(f"error: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_hooks(args: argparse.Namespace) -> int:
    from pathlib import Path

    from aep_collector.receivers import wiring
    from aep_collector.receivers.registration import using_home
    from aep_collector.receivers.registration import wiring as registration

    home = Path(args.home).expanduser().resolve() if args.home else None
    project = Path(args.project).expanduser().resolve() if args.project else None
    vendor = args.vendor.lower().replace("_", "-")
    with using_home(home):
        try:
            if args.uninstall:
                unrecorded = registration(vendor, url=args.url, config_path=args.hooks_config,
                                          registry=_registry() if args.hooks_config else None)
                changes = wiring.uninstall(vendor, args.dry_run, unrecorded, home, project)
                if not changes:
                    print(f"{vendor}: nothing of aep-collector found to remove", file=sys.stderr)
            else:
                reg = registration(vendor, url=args.url, config_path=args.hooks_config,
                                   registry=_registry() if args.hooks_config else None)
                for line in reg.advice[1 if args.install else 0:]:  # [0] says where to put the printed file
                    print(f"# {line}", file=sys.stderr)
                if not args.install:
                    if args.dry_run:
                        print("error: --dry-run goes with --install or --uninstall", file=sys.stderr)
                        return 2
                    sys.stdout.write(reg.text())
                    return 0
                changes = wiring.install(reg, home, project, dry_run=args.dry_run)
        except (KeyError, ConfigError, ValueError, wiring.WiringError, OSError) as exc:
            # A KeyError's str() is its message in quotes: error: "unknown vendor 'x' ...".
            print(f"error: {exc.args[0] if isinstance(exc, KeyError) and exc.args else exc}", file=sys.stderr)
            return 1
    for change in changes:
        print(change.line(args.dry_run))
        for note in change.notes:
            print(f"  note: {note}")
        if args.dry_run and change.after != change.before:
            sys.stdout.write(change.diff())
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # `aep-collector hooks codex | head`: the reader left; that is not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:  # Ctrl-C before the collector's own handler is in place (config, plug-ins)
        return 130


_CONFIG_OF = {"run": "run_config", "validate": "val_config", "hooks": "hooks_config", "status": "status_config"}
"""The commands that read a pipeline config, and where their own ``--config`` lands."""


def _main(argv: list[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    # `aep-collector --config FILE hooks codex` once printed the default ports' registration and
    # `... status` checked the default config's ports: the --config before the command was dropped.
    if args.config is not None:
        if args.command is not None and args.command not in _CONFIG_OF:
            parser.error(f"--config does not apply to {args.command}")
        if args.command is not None and getattr(args, _CONFIG_OF[args.command]) is None:
            setattr(args, _CONFIG_OF[args.command], args.config)
    if args.command == "validate":
        if args.val_config is None:
            parser.error("validate needs --config FILE")
        return cmd_validate(args.val_config)
    if args.command == "components":
        return cmd_components(args.json)
    if args.command == "validate-events":
        from .validate import main_validate_events

        return main_validate_events([args.file])
    if args.command == "hooks":
        return cmd_hooks(args)
    from .operator_cli import COMMANDS, run

    if args.command in COMMANDS:
        return run(args)
    path = getattr(args, "run_config", None) or args.config or DEFAULT_CONFIG
    return cmd_run(path)


if __name__ == "__main__":
    sys.exit(main())
