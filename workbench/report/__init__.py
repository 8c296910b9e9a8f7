"""plotly figures and the self-contained HTML writer."""
