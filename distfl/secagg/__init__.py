"""Secure aggregation, simulated exactly: integer sums modulo 2^b (modular.py) and the conditional
randomised rounding that puts a client's scaled update on the integer grid (rounding.py)."""
