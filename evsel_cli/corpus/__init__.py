"""A corpus index past one machine (`pip install 'evsel[scale]'`): chunks, their BM25 terms and
their per-chunk states in a Lance dataset, built on a Ray cluster (`evsel corpus build`).

`schema` (the layout, read by the build and the query side) and `rows` (parse, chunk and encode
exactly as `evsel ingest` does) need no Ray; `build` imports Ray. pyarrow and lance are imported
inside the functions that use them, so importing this package costs nothing without the extra.
"""
