"""The report as data: a list of blocks (headings, paragraphs, tables, lists, images) whose text is a
list of inline pieces, rendered once to Markdown (REPORT.md) and once to HTML (report.html).

The report's sections are built once, in :mod:`.report`; the two renderers here only decide how each
kind of block and inline piece is written, so the two files cannot say different things. The
measurement sections (:mod:`.benchmarks`, :mod:`.learnability`, :mod:`.portability`) write Markdown
lines; :func:`blocks_from_markdown` reads the subset they use into the same blocks.

Format-only differences live here and nowhere else: a verdict is a coloured badge in HTML and code in
Markdown; HTML headings carry ``id`` anchors and rows and lists their ``data-*`` attributes, which
Markdown has no syntax for (GitHub derives a heading's anchor from its text, :func:`github_anchor`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html import escape

# --- inline pieces: a plain ``str`` is text ---


@dataclass(frozen=True)
class Code:
    text: str


@dataclass(frozen=True)
class Bold:
    text: str


@dataclass(frozen=True)
class Link:
    href: str
    text: str


@dataclass(frozen=True)
class Badge:
    """A verdict name."""

    verdict: str


@dataclass(frozen=True)
class Ref:
    """A link to the heading whose text is ``heading`` (Markdown) and whose HTML id is ``html_id``."""

    text: str
    heading: str
    html_id: str


Inline = str | Code | Bold | Link | Badge | Ref
Text = tuple[Inline, ...]


def text(*pieces: Inline) -> Text:
    return tuple(pieces)


def markdown_text(line: str) -> Text:
    """A line of the Markdown the measurement sections write: backquoted spans are code."""
    parts = line.split("`")
    return tuple(Code(part) if i % 2 else part for i, part in enumerate(parts) if part)


# --- blocks ---


@dataclass(frozen=True)
class Heading:
    level: int
    text: Text
    html_id: str | None = None


@dataclass(frozen=True)
class Paragraph:
    #: one entry per source line (Markdown keeps the line breaks; a browser joins them)
    lines: tuple[Text, ...]


@dataclass(frozen=True)
class Image:
    src: str
    alt: str


@dataclass(frozen=True)
class Table:
    header: tuple[Text, ...]
    rows: tuple[tuple[Text, ...], ...]
    #: per column, "---" or "---:" (right-aligned), as Markdown writes it
    align: tuple[str, ...] = ()
    html_id: str | None = None
    html_class: str | None = None
    #: per row, the HTML attributes of its ``<tr>`` (empty: none)
    row_attrs: tuple[tuple[tuple[str, str], ...], ...] = ()


@dataclass(frozen=True)
class Item:
    text: Text
    children: tuple[Item, ...] = ()


@dataclass(frozen=True)
class BulletList:
    items: tuple[Item, ...]
    html_attrs: tuple[tuple[str, str], ...] = field(default=())


Block = Heading | Paragraph | Image | Table | BulletList


# --- Markdown ---


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation other than - and _ dropped."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _md_inline(piece: Inline) -> str:
    if isinstance(piece, str):
        return piece
    if isinstance(piece, Code):
        return f"`{piece.text}`"
    if isinstance(piece, Bold):
        return f"**{piece.text}**"
    if isinstance(piece, Link):
        return f"[{piece.text}]({piece.href})"
    if isinstance(piece, Badge):
        return f"`{piece.verdict}`"
    return f"[{piece.text}](#{github_anchor(piece.heading)})"


def _md_text(pieces: Text) -> str:
    return "".join(_md_inline(piece) for piece in pieces)


def _md_cell(pieces: Text) -> str:
    # a pipe would end the cell (in code too) and a newline the row
    def plain(piece: str) -> str:
        return piece.replace("|", "\\|").replace("\n", " ")

    return "".join(
        plain(p) if isinstance(p, str) else f"`{plain(p.text)}`" if isinstance(p, Code) else _md_inline(p)
        for p in pieces
    )


def _md_items(items: tuple[Item, ...], indent: str) -> list[str]:
    lines = []
    for item in items:
        lines.append(f"{indent}- {_md_text(item.text)}")
        lines += _md_items(item.children, indent + "  ")
    return lines


def _md_block(block: Block) -> list[str]:
    if isinstance(block, Heading):
        return ["#" * block.level + " " + _md_text(block.text)]
    if isinstance(block, Paragraph):
        return [_md_text(line) for line in block.lines]
    if isinstance(block, Image):
        return [f"![{block.alt}]({block.src})"]
    if isinstance(block, Table):
        align = block.align or ("---",) * len(block.header)
        rows = [block.header, *block.rows]
        lines = ["| " + " | ".join(_md_cell(cell) for cell in row) + " |" for row in rows]
        return [lines[0], "|" + "".join(a + "|" for a in align), *lines[1:]]
    return _md_items(block.items, "")


def to_markdown(blocks: list[Block]) -> str:
    """Blocks separated by one blank line; the file ends with a newline."""
    return "\n\n".join("\n".join(_md_block(block)) for block in blocks) + "\n"


# --- HTML ---


def html_badge(verdict: str) -> str:
    return f'<span class="verdict v-{escape(verdict)}">{escape(verdict)}</span>'


def _html_inline(piece: Inline) -> str:
    if isinstance(piece, str):
        return escape(piece)
    if isinstance(piece, Code):
        return f"<code>{escape(piece.text)}</code>"
    if isinstance(piece, Bold):
        return f"<b>{escape(piece.text)}</b>"
    if isinstance(piece, Link):
        return f'<a href="{escape(piece.href, quote=True)}">{escape(piece.text)}</a>'
    if isinstance(piece, Badge):
        return html_badge(piece.verdict)
    return f'<a href="#{escape(piece.html_id, quote=True)}">{escape(piece.text)}</a>'


def _html_text(pieces: Text) -> str:
    return "".join(_html_inline(piece) for piece in pieces)


def _attrs(pairs) -> str:
    return "".join(f' {name}="{escape(value, quote=True)}"' for name, value in pairs)


def _html_items(items: tuple[Item, ...]) -> str:
    out = []
    for item in items:
        children = f"<ul>{_html_items(item.children)}</ul>" if item.children else ""
        out.append(f"<li>{_html_text(item.text)}{children}</li>")
    return "".join(out)


def _html_block(block: Block) -> list[str]:
    if isinstance(block, Heading):
        tag, attrs = f"h{block.level}", _attrs([("id", block.html_id)] if block.html_id else [])
        return [f"<{tag}{attrs}>{_html_text(block.text)}</{tag}>"]
    if isinstance(block, Paragraph):
        return ["<p>" + "\n".join(_html_text(line) for line in block.lines) + "</p>"]
    if isinstance(block, Image):
        return [f'<img src="{escape(block.src, quote=True)}" alt="{escape(block.alt, quote=True)}">']
    if isinstance(block, Table):
        attrs = _attrs([(k, v) for k, v in (("id", block.html_id), ("class", block.html_class)) if v])
        head = "".join(f"<th>{_html_text(cell)}</th>" for cell in block.header)
        lines = [f"<table{attrs}><thead><tr>{head}</tr></thead><tbody>"]
        for i, row in enumerate(block.rows):
            cells = "".join(f"<td>{_html_text(cell)}</td>" for cell in row)
            lines.append(f"<tr{_attrs(block.row_attrs[i]) if block.row_attrs else ''}>{cells}</tr>")
        lines.append("</tbody></table>")
        return lines
    return [f"<ul{_attrs(block.html_attrs)}>{_html_items(block.items)}</ul>"]


def to_html(blocks: list[Block]) -> str:
    """The blocks as HTML elements, one line each (a table: one line per row)."""
    return "\n".join(line for block in blocks for line in _html_block(block))


# --- the Markdown the measurement sections write ---

_ROW_SPLIT = re.compile(r"(?<!\\)\|")


def _cells(line: str) -> tuple[Text, ...]:
    cells = _ROW_SPLIT.split(line.strip())[1:-1]
    return tuple(markdown_text(cell.strip().replace("\\|", "|")) for cell in cells)


def _block_from_lines(lines: list[str]) -> Block:
    first = lines[0]
    if first.startswith("#"):
        level = len(first) - len(first.lstrip("#"))
        return Heading(level, markdown_text(first[level + 1 :]))
    if first.startswith("|"):
        align = tuple(cell.strip() for cell in _ROW_SPLIT.split(lines[1].strip())[1:-1])
        return Table(_cells(first), tuple(_cells(line) for line in lines[2:]), align)
    if first.startswith("- "):
        return BulletList(tuple(Item(markdown_text(line[2:])) for line in lines))
    image = re.fullmatch(r"!\[(.*)\]\((.*)\)", first)
    if image and len(lines) == 1:
        return Image(image.group(2), image.group(1))
    return Paragraph(tuple(markdown_text(line) for line in lines))


def blocks_from_markdown(lines: list[str]) -> list[Block]:
    """Headings, pipe tables (header, alignment row, rows), one-level bullet lists, images and
    paragraphs, separated by blank lines: the Markdown :mod:`.benchmarks` and its siblings write."""
    blocks: list[Block] = []
    current: list[str] = []
    for line in [*lines, ""]:
        if line:
            current.append(line)
        elif current:
            blocks.append(_block_from_lines(current))
            current = []
    return blocks
