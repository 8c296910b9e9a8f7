"""Executed notebooks as self-contained HTML pages that open offline.

nbconvert's `lab` template loads require.js, MathJax and mermaid from a CDN and, when the
notebook holds widget state, the widget manager from unpkg; plotly figures executed in a
kernel are stored as `application/vnd.plotly.v1+json`, which a static page cannot draw
without plotly.js. So the export (1) turns each plotly output into an HTML div drawn by one
copy of plotly.js inlined in the page head, as the workbench's own reports are; (2) replaces
ipywidgets views, which need a live kernel, by a note saying so; (3) renders with a template
that extends `lab` without any of its remote scripts. Images are embedded.
"""

from __future__ import annotations

import copy
from pathlib import Path

import jinja2
import nbformat
import plotly.io as pio
from nbconvert import HTMLExporter
from plotly.offline import get_plotlyjs

from workbench.errors import WorkbenchError
from workbench.report.html import write_atomic

PLOTLY = "application/vnd.plotly.v1+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = (
    '<p class="wb-widget-note"><em>Interactive controls (ipywidgets) need a running kernel: '
    "open the notebook in JupyterLab to use them.</em></p>"
)
# `lab` without its CDN scripts; plotly.js takes require.js's place in the head.
OFFLINE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}
<script type="text/javascript">{{ resources.plotly_js }}</script>
{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
"""


def offline_outputs(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of the notebook with plotly outputs as HTML divs (no plotly.js of their own) and
    widget views as a note; widget state, which would pull the widget manager from a CDN, gone."""
    notebook = copy.deepcopy(notebook)
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if PLOTLY in data:
                div = pio.to_html(dict(data.pop(PLOTLY)), include_plotlyjs=False,
                                  full_html=False, config={"displaylogo": False})  # fmt: skip
                data["text/html"] = div
            if WIDGET_VIEW in data:
                output["data"] = {"text/html": WIDGET_NOTE}
    notebook.metadata.pop("widgets", None)
    return notebook


def execute(notebook: nbformat.NotebookNode, cwd: Path, timeout_s: int = 600) -> None:
    """Run every cell in a fresh kernel, in `cwd` (the notebooks find raw/ and ncu/ from there)."""
    from nbclient import NotebookClient

    client = NotebookClient(notebook, timeout=timeout_s, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})  # fmt: skip
    client.execute()


def to_html(notebook: nbformat.NotebookNode, title: str) -> str:
    """An executed notebook as one offline HTML page (plotly.js inlined once, no CDN)."""
    exporter = HTMLExporter(
        template_name="lab",
        extra_loaders=[jinja2.DictLoader({"offline.html.j2": OFFLINE_TEMPLATE})],
        template_file="offline.html.j2",
        embed_images=True,
    )
    body, _ = exporter.from_notebook_node(
        offline_outputs(notebook),
        resources={"plotly_js": get_plotlyjs(), "metadata": {"name": title}},
    )
    return body


def export_notebook(
    notebook_path: str | Path, html: str | Path, run: bool = False, timeout_s: int = 600
) -> Path:
    """Write `notebook_path` as an offline HTML page at `html`; with `run`, execute it first.

    A notebook saved without outputs exports as code alone, so pass `run=True` for figures.
    """
    source = Path(notebook_path)
    if not source.is_file():
        raise WorkbenchError(f"{source} does not exist; give the path of an .ipynb notebook.")
    notebook = nbformat.read(source, as_version=4)
    if run:
        execute(notebook, source.resolve().parent, timeout_s)
    elif not has_outputs(notebook):  # a page of code alone must say so, or it reads as broken
        notebook.cells.insert(0, nbformat.v4.new_markdown_cell(code_only_note(source)))
    return write_atomic(html, to_html(notebook, source.stem))


def has_outputs(notebook: nbformat.NotebookNode) -> bool:
    """Whether any code cell holds an output (the committed notebooks are saved without)."""
    return any(cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")


CODE_ONLY = "without results"  # the note's words that tell a code-only page


def code_only_note(source: Path) -> str:
    return (
        f"**This page shows the code of `{source.name}` {CODE_ONLY}**: the notebook was "
        "exported without running it. `workbench export-notebook "
        f"{source} --execute --html PAGE` runs it first, with its tables and figures."
    )
