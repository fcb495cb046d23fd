"""The subcommands of ``dtprof`` that have logic of their own, one module each; dtprof/cli.py
parses the arguments and dispatches to them."""
