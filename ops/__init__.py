"""tokenledger: ops package."""
