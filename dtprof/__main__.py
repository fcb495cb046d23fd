from dtprof.cli import run

run()
