"""The answer stage: evidence to an answer (step), the text side of grounded answers (grounding), and
the text the reader reads beside each shown passage (windows)."""
