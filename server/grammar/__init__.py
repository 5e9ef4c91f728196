"""Structured output: grammar specs (torch-free), compilation, matchers and masks (xgrammar),
and the reasoning parser. The matcher is staged in each result's transaction (commitlog)."""
