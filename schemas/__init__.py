"""Record schemas (pandera) and the experiment spec (pydantic): the single source of truth for columns."""
