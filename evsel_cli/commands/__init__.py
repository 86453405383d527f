"""One module per command group; evsel.cli assembles them."""
