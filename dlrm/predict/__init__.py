"""Scoring rows with an exported model: the command (`cli`), the scoring itself (`score`), and one
input module per format (`criteo`, `parquet`) and for bundles (`bundle`)."""
