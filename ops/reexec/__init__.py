"""`tokenledger replay --reexecute`: re-drive a log's schedule through the real engine pieces and
prove every committed token and logprob (docs/reexecution.md)."""
