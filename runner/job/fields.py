"""The job's field types and its one kind of validation error, shared by every section
(the sections in ``runner/job/schema.py``, a cloud's in ``runner/job/clouds/``): strict
numbers, strings and booleans within the bounds a 64-bit run can hold, and
:func:`job_error`, whose hint the job's error formatter shows."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import SplitResult, urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict
from pydantic_core import PydanticCustomError


def _integral(value: Any) -> Any:
    """``max_tokens: 1e9`` is an integer written as a float: accept it."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Every number a job holds ends up in a 64-bit integer (steps, tokens, seeds: torch's
# generators take at most 2^64 - 1) or takes part in float arithmetic that must not
# overflow (lr x a schedule): bounds for all of them, on top of each field's own.
MAX_INT = 2**63 - 1
MAX_FLOAT = 1e15


def _int64(value: int) -> int:
    if not -MAX_INT - 1 <= value <= MAX_INT:
        raise job_error(f"is too large: at most {MAX_INT:,} (a 64-bit integer)",
                        show_value=False)
    return value


def _bounded(value: float) -> float:
    if abs(value) > MAX_FLOAT:
        raise job_error(f"is too large: at most {MAX_FLOAT:g} in size")
    return value


def bounded(kind: type, **bounds: float) -> Any:
    """A strict number of the job (:data:`Int`, :data:`Float`) within ``bounds`` (``ge=1``).
    The bounds come before the validators, so that they stay the number's own and the
    editor schema shows them as JSON Schema's ``minimum`` and the like, also in
    ``bounded(int, ge=1) | None``."""
    if kind is int:  # 1e9 is an integer written as a float; 2.5, "3" and true are not
        return Annotated[int, Strict(), Field(**bounds), BeforeValidator(_integral),
                         AfterValidator(_int64)]
    # ints are accepted as floats, strings and bools are not
    return Annotated[float, Strict(), Field(**bounds), AfterValidator(_bounded)]


Int = bounded(int)
Float = bounded(float)
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]


def job_error(message: str, hint: str = "", show_value: bool = True) -> PydanticCustomError:
    """A validation error carrying a hint; the value shown is added by the formatter."""
    return PydanticCustomError("job", message.replace("{", "{{").replace("}", "}}"),
                               {"hint": hint, "show_value": show_value})


def parsed_url(url: str, hint: str, show_value: bool = True) -> SplitResult:
    """``url`` split as HTTP clients split it; "is not a URL" (with ``hint``) when it does
    not parse, its port included (parsed on access)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number, or out of range
    except ValueError as e:
        raise job_error(f"is not a URL ({e})", hint=hint, show_value=show_value) from None
    return parts


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
