"""How a configuration mistake is told: one line per mistake, naming the file, the dotted key and the fix.

    conf/training/fraud.yaml: key 'optimizer.lr': Input should be greater than 0 (got -1)
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """A configuration file is missing, unparsable or invalid."""


class Refusal(ValueError):
    """A validator's error that names its own key and may keep the value out of the message.

    ``at`` is the key relative to where pydantic reports the error (a model validator reports at the
    model's own location, which for a whole file is its top level); ``echo=False`` hides the input.
    """

    def __init__(self, message: str, at: tuple[str | int, ...] = (), echo: bool = True) -> None:
        super().__init__(message)
        self.at = at
        self.echo = echo


def short(value: object, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters: a caller's value is shown, never a caller's essay."""
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 1] + "…"


def did_you_mean(word: object, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when ``word`` is a near miss of one of ``known``, else ``""``."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def format_loc(loc: tuple[Any, ...]) -> str:
    """A pydantic location as the dotted key a user reads in the file: ``sites[1].storage``."""
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        else:
            name = "schema" if p == "schema_" else str(p)
            # An unknown key is named, but a long one cut short: it may be a secret pasted as a key.
            name = name if len(name) <= 40 else name[:39] + "…"
            parts.append(("." if parts else "") + name)
    return "".join(parts) or "<top level>"


def _unwrap(t: Any) -> Any:
    """``t`` without ``Annotated`` metadata and without ``| None``."""
    if get_origin(t) is Annotated:
        t = get_args(t)[0]
    if get_origin(t) in (Union, types.UnionType):
        t = next((a for a in get_args(t) if a is not type(None)), t)
    return t


def known_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed in the mapping at ``loc`` of a file that ``model`` validates ([] if not a model)."""
    t: Any = model
    for part in loc:
        t = _unwrap(t)
        if isinstance(t, type) and issubclass(t, BaseModel):
            field = next((f for n, f in t.model_fields.items() if part in (n, f.alias)), None)
            if field is None:
                return []
            t = field.annotation
        elif get_origin(t) in (list, dict):
            t = get_args(t)[-1]  # the item type of a list, the value type of a dict
        else:
            return []
    t = _unwrap(t)
    if not (isinstance(t, type) and issubclass(t, BaseModel)):
        return []
    return [f.alias or n for n, f in t.model_fields.items()]


def explain(path: Path, err: ValidationError, model: type[BaseModel], at: tuple[str | int, ...] = ()) -> ConfigError:
    """``err`` as a :class:`ConfigError` with one line per distinct mistake: file, key, what is wrong, the fix.
    ``at``: where in the file the mapping ``model`` validated lies (empty: the whole file)."""
    lines: list[str] = []
    for e in err.errors():
        loc = tuple(e["loc"])
        cause = e.get("ctx", {}).get("error")
        refusal = cause if isinstance(cause, Refusal) else None
        key = format_loc(at + loc + (refusal.at if refusal else ()))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            known = known_keys(model, loc[:-1])
            msg = "unknown key; remove it or check the spelling"
            msg += did_you_mean(loc[-1], known) if loc else ""
            msg += f"; known keys: {', '.join(known)}" if known else ""
        elif e["type"] == "missing":
            msg = "required key is missing"
        got = e.get("input")
        # A value is echoed only where it helps and cannot be a secret, as the message ends up in run states
        # and logs. Never an unknown key's (a secret pasted under a wrong key, or a file that is no config at
        # all), never a *_env key's (a key pasted where the name of its variable belongs), never a whole
        # mapping or list, nor where the validator said not to.
        echo = (
            e["type"] not in ("missing", "extra_forbidden")
            and not isinstance(got, dict | list)
            and not (loc and str(loc[-1]).endswith("_env"))
            and (refusal is None or refusal.echo)
        )
        line = f"{path}: key '{key}': {msg}" + (f" (got {short(got)})" if echo else "")
        if line not in lines:  # a union's branches can report one mistake several times
            lines.append(line)
    return ConfigError("\n".join(lines))
