"""What user code holds: analysis results with their figures and HTML pages attached.

`workbench.analysis` builds tables and never draws; `workbench.report` draws them. A view is an
analysis class with `.figure()` and `.to_html()` methods that call the report functions, so a
notebook or script keeps one object per result.

Views import `workbench.report` (and so plotly) only when a figure or page is asked for, so
`import workbench` and loading artifacts work where plotly is not installed.
"""
