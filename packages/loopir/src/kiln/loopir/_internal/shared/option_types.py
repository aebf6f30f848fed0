"""Type checks of a codegen's options dataclass, done once when the options are built."""

from __future__ import annotations

import pathlib
from typing import Any

# option -> (accepted types, what the error says it accepts)
OptionTypes = dict[str, tuple[tuple[type, ...], str]]


def check_option_types(options: Any, types: OptionTypes) -> None:
    """Raise TypeError naming the first field of `options` whose value is not of its accepted
    types (a bool is refused where only ints are accepted: True is an int to isinstance); then
    make `cache_dir`, when the options have one, a `pathlib.Path`."""
    owner = type(options).__name__
    for name, (kinds, wanted) in types.items():
        value = getattr(options, name)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise TypeError(f"{owner}.{name} must be {wanted}, got {value!r} ({type(value).__name__})")
    if hasattr(options, "cache_dir"):
        object.__setattr__(options, "cache_dir", pathlib.Path(options.cache_dir))
