"""`python -m distfl.sweep train-args CONFIG [key=value ...]`: see `cli.train_args_main`."""
import sys

from .cli import train_args_main

sys.exit(train_args_main(sys.argv[1:]))
