"""tokenledger: kernels package."""
