"""tokenledger: commitlog package."""
