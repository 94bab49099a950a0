"""quest-bench task `points`: point-cloud classification with dot-product point transformers (torch-geometric)."""
