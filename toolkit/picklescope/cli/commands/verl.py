"""``picklescope verl``: install real verl versions side by side, list them, map what they can carry."""

from __future__ import annotations

import argparse
import time
from typing import Any

from picklescope.cli.commands.common import print_json
from picklescope.errors import PicklescopeError
from picklescope.verl import envs
from picklescope.verl.childcall import call
from picklescope.verl.matrix import capability_matrix, matrix_rows
from picklescope.views import table

ORDER = 40


def register(sub: Any) -> None:
    p = sub.add_parser("verl", help="install and inspect real verl versions (one folder each)")
    vsub = p.add_subparsers(dest="verl_command", metavar="ACTION")
    i = vsub.add_parser("install", help="pip install --no-deps --target each version into its own folder")
    i.add_argument("versions", nargs="*", help="verl versions, e.g. 0.9.0 0.9.1")
    i.add_argument("--source", default=None, help="a verl checkout to register (as verl-local by default)")
    i.add_argument("--name", default="local", help="label for --source (codecs verl-<name>:torch|numpy)")
    i.add_argument("--force", action="store_true", help="reinstall even if present")
    i.set_defaults(func=install)
    ls = vsub.add_parser("list", help="installed verl environments and their codecs")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=list_envs)
    ck = vsub.add_parser("check", help="import each environment in a child: version, file, nothing shadowed")
    ck.add_argument("labels", nargs="*", help="installed versions or checkout names (default: all)")
    ck.set_defaults(func=check)
    rm = vsub.add_parser("remove", help="delete an installed environment (a checkout is never touched)")
    rm.add_argument("label")
    rm.set_defaults(func=remove)
    m = vsub.add_parser("matrix", help="round trip every leaf kind through each real codec (both modes)")
    m.add_argument("labels", nargs="*", help="installed versions (default: all)")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=matrix)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def install(args: argparse.Namespace) -> int:
    if not args.versions and not args.source:
        raise PicklescopeError("nothing to install", "give versions (e.g. 0.9.0 0.9.1) and/or --source PATH")
    t0 = time.monotonic()
    for version in args.versions:
        env = envs.install_version(version, force=args.force)
        how = f"pip took {env.install_s:.1f} s" if env.install_s is not None else "checkout"
        moved = f"; moved aside: {', '.join(env.stray)}" if env.stray else ""
        print(f"verl {env.version}: {env.site} ({how}{moved}) -> codecs {env.codec_prefix}:torch, "
              f"{env.codec_prefix}:numpy")
    if args.source:
        env = envs.install_source(args.source, args.name)
        print(f"verl {env.version} from {env.source}: linked at {env.site / 'verl'} -> codecs "
              f"{env.codec_prefix}:torch, {env.codec_prefix}:numpy")
    print(f"done in {time.monotonic() - t0:.1f} s (cache: {envs.verl_root()})")
    return 0


def list_envs(args: argparse.Namespace) -> int:
    from dataclasses import asdict


    found = envs.installed()
    if args.json:
        print_json([{**asdict(e), "site": str(e.site)} for e in found])
        return 0
    if not found:
        print(f"no verl installed in {envs.verl_root()} (try 'picklescope verl install 0.9.0 0.9.1')")
        return 0
    for e in found:
        print(f"{e.codec_prefix:<16} verl {e.version:<8} {e.source:<8} {e.site}")
    return 0


def check(args: argparse.Namespace) -> int:
    labels = args.labels or [e.label for e in envs.installed()]
    bad = 0
    for label in labels:
        r = call("picklescope.verl.loader.import_report", label=label)
        ok = len(r["verl_dirs_on_path"]) == 1 and not r["stray_tests_shadowing"]
        bad += not ok
        tests = ", ".join(r["tests_importable_from"]) or "none"
        print(f"verl-{label}: verl {r['verl_version']} from {r['verl_file']} (import {r['import_s']:.1f} s); "
              f"verl folders on sys.path: {len(r['verl_dirs_on_path'])}; 'tests' importable from: {tests}"
              + ("" if ok else "  <- PROBLEM"))
    return 1 if bad else 0


def remove(args: argparse.Namespace) -> int:
    envs.remove(args.label)
    print(f"removed verl-{args.label}")
    return 0


def matrix(args: argparse.Namespace) -> int:
    labels = args.labels or [e.label for e in envs.installed()]
    if not labels:
        raise PicklescopeError("no verl installed", "run 'picklescope verl install 0.9.0 0.9.1' first")
    results = [capability_matrix(label) for label in labels]
    if args.json:
        print_json([r.to_dict() for r in results])
        return 0
    for r in results:
        print(f"verl {r.version} ({r.verl_file}); workload {r.workload} leaf by leaf, round trip over pickle5-oob")
        print(table.render(matrix_rows(r)))
        print()
    return 0
