"""tokenledger: server package."""
