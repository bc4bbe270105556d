"""The report's one model (audit/document.py): the Markdown the measurement sections write reads
into blocks that write the same Markdown back, and each block renders to both formats."""

from __future__ import annotations

from zeromismatch.audit.document import (
    Badge,
    Bold,
    BulletList,
    Code,
    Heading,
    Item,
    Link,
    Ref,
    Table,
    blocks_from_markdown,
    text,
    to_html,
    to_markdown,
)

SECTION = [
    "### Per-op throughput (`ops.json`, 1 thread(s))",
    "",
    "Target: every op at ≥ 0.9.",
    "A second line of the same paragraph.",
    "",
    "| op | shapes | note |",
    "|---|---:|---|",
    "| gemm | 3 | a \\| b and `x` |",
    "",
    "- `aligned` set: 13 of 18",
    "- `aligned-native` set: 18 of 18",
    "",
    "![throughput ratios](figures/throughput_ratios.png)",
]


def test_section_markdown_round_trips_through_blocks():
    assert to_markdown(blocks_from_markdown(SECTION)) == "\n".join(SECTION) + "\n"


def test_section_html_has_one_element_per_block():
    html = to_html(blocks_from_markdown(SECTION))
    assert html.splitlines() == [
        "<h3>Per-op throughput (<code>ops.json</code>, 1 thread(s))</h3>",
        "<p>Target: every op at ≥ 0.9.",
        "A second line of the same paragraph.</p>",
        "<table><thead><tr><th>op</th><th>shapes</th><th>note</th></tr></thead><tbody>",
        "<tr><td>gemm</td><td>3</td><td>a | b and <code>x</code></td></tr>",
        "</tbody></table>",
        "<ul><li><code>aligned</code> set: 13 of 18</li>"
        "<li><code>aligned-native</code> set: 18 of 18</li></ul>",
        '<img src="figures/throughput_ratios.png" alt="throughput ratios">',
    ]


def test_format_only_pieces_render_per_format():
    blocks = [
        Heading(3, text("S1-a.b"), html_id="claim-S1-a_b"),
        Table(
            (text("claim"), text("verdict")),
            ((text(Ref("S1-a.b", "S1-a.b", "claim-S1-a_b")), text(Badge("not-run"))),),
            html_id="claims",
            row_attrs=((("class", "claim"), ("data-verdict", "not-run")),),
        ),
        BulletList(
            (Item(text(Bold("Run:"), " ", Link("runs/a/", "runs/a/")), (Item(text("x = 1 (holds)")),)),),
            html_attrs=(("class", "detail"),),
        ),
    ]
    assert to_markdown(blocks) == (
        "### S1-a.b\n\n| claim | verdict |\n|---|---|\n| [S1-a.b](#s1-ab) | `not-run` |\n\n"
        "- **Run:** [runs/a/](runs/a/)\n  - x = 1 (holds)\n"
    )
    html = to_html(blocks)
    assert '<h3 id="claim-S1-a_b">S1-a.b</h3>' in html
    assert '<tr class="claim" data-verdict="not-run"><td><a href="#claim-S1-a_b">S1-a.b</a></td>' in html
    assert '<span class="verdict v-not-run">not-run</span>' in html
    assert html.endswith(
        '<ul class="detail"><li><b>Run:</b> <a href="runs/a/">runs/a/</a>'
        "<ul><li>x = 1 (holds)</li></ul></li></ul>"
    )
    assert to_html([Heading(2, text(Code("a<b")))]) == "<h2><code>a&lt;b</code></h2>"
