"""How the CLI prints: Rich tables on a terminal, complete lines anywhere else.

Rich fits a table to the terminal and cuts what does not fit
(`committ…`, `2026-11…`).  Off a terminal (a pipe, a file, a log) that
loses data, so there a table is printed as tab-separated values: one header
line, then one line per row, every cell whole, markup stripped.  A title
becomes a `# ` comment line.  Other text is never wrapped off a terminal.

Commands import `Console` and `Table` from here instead of from Rich; the
calls are Rich's (`Table("a", "b", title=...)`, `add_column`, `add_row`,
`console.print(table)`).
"""

from __future__ import annotations

from typing import IO, Any

from rich.console import Console as RichConsole
from rich.table import Table as RichTable
from rich.text import Text


def plain(cell: Any) -> str:
    """A cell as text: Rich markup stripped, tabs and newlines made blanks."""
    if isinstance(cell, Text):
        s = cell.plain
    else:
        s = Text.from_markup(str(cell)).plain if isinstance(cell, str) else str(cell)
    return s.replace("\t", " ").replace("\r", " ").replace("\n", " ")


class Table:
    """Rows and columns, kept until printed; Rich's constructor and methods."""

    def __init__(self, *columns: str, title: str | None = None, **style: Any) -> None:
        self.title = title
        self.style = style
        self.columns: list[tuple[str, dict[str, Any]]] = [(c, {}) for c in columns]
        self.rows: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def add_column(self, header: str, **kw: Any) -> None:
        self.columns.append((header, kw))

    def add_row(self, *cells: Any, **kw: Any) -> None:
        self.rows.append((cells, kw))

    def __rich__(self) -> RichTable:
        """Printed by a plain Rich console, it is a Rich table."""
        return self.rich()

    def rich(self) -> RichTable:
        t = RichTable(title=self.title, **self.style)
        for header, kw in self.columns:
            t.add_column(header, **kw)
        for cells, kw in self.rows:
            t.add_row(*cells, **kw)
        return t

    def tsv(self) -> str:
        lines = [f"# {plain(self.title)}"] if self.title else []
        lines.append("\t".join(plain(h) for h, _ in self.columns))
        lines += ["\t".join(plain(c) for c in cells) for cells, _ in self.rows]
        return "\n".join(lines) + "\n"


class Console(RichConsole):
    """Rich's console, except off a terminal: tables as TSV, no wrapping."""

    def __init__(self, file: IO[str] | None = None, **kw: Any) -> None:
        super().__init__(file=file, **kw)
        if not self.is_terminal:
            self.soft_wrap = True

    def print(self, *objects: Any, **kw: Any) -> None:
        for obj in objects:
            if isinstance(obj, Table):
                if self.is_terminal:
                    super().print(obj.rich(), **kw)
                else:
                    self.file.write(obj.tsv())
                    self.file.flush()
            else:
                super().print(obj, **kw)
