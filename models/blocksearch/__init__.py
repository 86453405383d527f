"""BlockSearch (seed 001): routing by the backbone's own QK scores, its scoring functions, the trained
router and the trained decoder."""
