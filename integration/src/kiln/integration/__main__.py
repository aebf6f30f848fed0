"""`python -m kiln.integration cache info|clear [--cache-dir DIR]`: the whole-graph cache."""

from __future__ import annotations

import argparse

from ._internal.graph_cache import GraphCache, cache_root
from ._internal.options import KilnOptions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln.integration", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    cache = commands.add_parser("cache", help="the whole-graph compiled-artifact cache")
    cache.add_argument("action", choices=["info", "clear"])
    cache.add_argument("--cache-dir", help="the cache_dir option (default: KILN_CACHE_DIR, else the per-user cache)")
    args = parser.parse_args(argv)
    options = KilnOptions.create({"cache_dir": args.cache_dir} if args.cache_dir else None)
    graphs = GraphCache(cache_root(options), options.graph_cache_max_bytes)
    if args.action == "info":
        print(graphs.info())
    else:
        print(f"removed {graphs.clear()} entries from {graphs.directory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
