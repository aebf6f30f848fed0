"""`python -m kiln.integration cache info|clear|save PATH|load PATH [--cache-dir DIR]`: the
whole-graph cache (`save` and `load` ship it to another machine of the same kind)."""

from __future__ import annotations

import argparse

from ._internal.cache_archive import load_cache, save_cache
from ._internal.graph_cache import GraphCache, cache_root
from ._internal.options import KilnOptions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln.integration", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    cache = commands.add_parser("cache", help="the whole-graph compiled-artifact cache")
    cache.add_argument("action", choices=["info", "clear", "save", "load"])
    cache.add_argument("archive", nargs="?", help="the archive `save` writes and `load` reads")
    cache.add_argument("--cache-dir", help="the cache_dir option (default: KILN_CACHE_DIR, else the per-user cache)")
    args = parser.parse_args(argv)
    options = KilnOptions.create({"cache_dir": args.cache_dir} if args.cache_dir else None)
    graphs = GraphCache(cache_root(options), options.graph_cache_max_bytes)
    if args.action in ("save", "load") and args.archive is None:
        parser.error(f"cache {args.action} needs the archive's path")
    if args.action == "info":
        print(graphs.info())
    elif args.action == "clear":
        print(f"removed {graphs.clear()} entries from {graphs.directory}")
    elif args.action == "save":
        print(f"saved {save_cache(args.archive, options)} entries of {graphs.directory.parent} to {args.archive}")
    else:
        print(f"loaded {load_cache(args.archive, options)} new entries from {args.archive} into {graphs.directory.parent}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
