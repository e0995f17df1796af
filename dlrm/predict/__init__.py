"""Scoring rows with an exported model: `python -m dlrm.predict MODEL --data DATA` (`cli`), the
scoring itself (`score`), and one input module per format (`criteo`, `parquet`)."""
