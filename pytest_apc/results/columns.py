"""How a report row declares its columns, once.

A row class is a frozen dataclass (:class:`Row`). Its stored fields (:func:`stored`) are the keys of its
row in results.json, in the file's order, each with the summary.md column it shows as (header and number
format; no header: the file only). Its ``TERMINAL`` columns (:class:`Column`) are the cells of the
terminal table, some shown only with -v. A row built by a live session and a row read back from a results
file (:meth:`Row.from_json`) are the same class, so every output renders either alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, ClassVar, Generic, TypeVar

from pytest_apc.results.formatting import num

R = TypeVar("R", bound="Row")

# How summary.md writes a stored value: a format spec for :func:`num`, a function of the value, or None
# (:func:`num` as it is).
Format = str | Callable[[Any], str] | None


def stored(
    header: str | None,
    fmt: Format = None,
    *,
    default: Any = MISSING,
    sparse: bool = False,
    cell: Callable[[Any], str] | None = None,
) -> Any:
    """A key of the row in results.json, shown in summary.md as the column ``header`` (None: in the file
    only) and formatted by ``fmt``, or ``cell`` of the whole row where the cell shows more than the key. A
    key that an older results file lacks reads as ``default``, else None. ``sparse``: a table shows the
    column only when one of its rows has a value (files written before the key existed print as they did)."""
    return field(default=default, metadata={"header": header, "fmt": fmt, "sparse": sparse, "cell": cell})


def present(*names: str) -> Callable[[Sequence[Any]], bool]:
    """Whether one of the rows has a value for one of these fields: a sparse column's ``shown``."""
    return lambda rows: any(getattr(row, name, None) is not None for row in rows for name in names)


@dataclass(frozen=True)
class Column(Generic[R]):
    """A column of a table: its header and a row's cell (text, or a value that tabulate prints as it is;
    None prints empty). ``verbose``: the terminal shows it only with -v. ``shown``: whether a table of
    these rows has the column at all (None: always)."""

    header: str
    cell: Callable[[R], object]
    verbose: bool = False
    shown: Callable[[Sequence[R]], bool] | None = None


def _markdown_cell(name: str, fmt: Format) -> Callable[[Any], str]:
    def cell(row: Any) -> str:
        value = getattr(row, name, None)  # None in a row of a class without the field: n/a
        return fmt(value) if callable(fmt) else num(value, fmt)

    return cell


@dataclass(frozen=True, kw_only=True)
class Row:
    """A row of one of the report's tables; subclasses declare their fields with :func:`stored` and their
    terminal cells in ``TERMINAL``."""

    TERMINAL: ClassVar[tuple[Column[Any], ...]] = ()

    @classmethod
    def stored_fields(cls) -> list[Field[Any]]:
        return [f for f in fields(cls) if "header" in f.metadata]

    @classmethod
    def from_json(cls: type[R], row: Mapping[str, Any]) -> R:
        """The row as a results file stores it: nothing is recomputed; a key the file lacks (a sparse column)
        reads as the field's default, else None."""
        return cls(
            **{f.name: row.get(f.name, None if f.default is MISSING else f.default) for f in cls.stored_fields()}
        )

    @classmethod
    def typed(cls: type[R], rows: Sequence[R | Mapping[str, Any]]) -> list[R]:
        """Rows of this table, whether built by a session or as results.json stores them (dicts)."""
        return [row if isinstance(row, cls) else cls.from_json(row) for row in rows]  # type: ignore[arg-type]

    def to_json(self) -> dict[str, Any]:
        """The row as results.json stores it (its stored fields, in order)."""
        return {f.name: getattr(self, f.name) for f in self.stored_fields()}

    @property
    def numbers(self) -> dict[str, Any]:
        return self.to_json()

    @classmethod
    def markdown_columns(cls, rows: Sequence[Any] = ()) -> list[Column[Any]]:
        """summary.md's columns for these rows: every stored field with a header, in the file's order (a
        sparse one where a row has a value)."""
        return [
            Column(f.metadata["header"], f.metadata["cell"] or _markdown_cell(f.name, f.metadata["fmt"]))
            for f in cls.stored_fields()
            if f.metadata["header"] and (not f.metadata["sparse"] or present(f.name)(rows))
        ]

    @classmethod
    def terminal_columns(cls, rows: Sequence[Any], verbose: bool = False) -> list[Column[Any]]:
        """The terminal table's columns for these rows (-v adds its own)."""
        return [c for c in cls.TERMINAL if (verbose or not c.verbose) and (c.shown is None or c.shown(rows))]


def cells(columns: Sequence[Column[Any]], rows: Sequence[Any]) -> tuple[list[str], list[list[object]]]:
    """The headers and the body of a table (what tabulate takes)."""
    return [c.header for c in columns], [[c.cell(row) for c in columns] for row in rows]
