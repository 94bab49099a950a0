"""quest-bench tasks ``speech-commands`` and ``asr``: torchaudio Conformer with quest-core attention."""
