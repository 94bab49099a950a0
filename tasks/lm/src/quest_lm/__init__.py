"""quest-bench task `lm`: a GPT-style causal decoder with quest-core attention on WikiText."""
