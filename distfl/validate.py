"""Old import path of the number rules in `distfl.config.values`, kept for code that imports it."""
from distfl.config.values import (FLOAT32_MAX, FLOAT32_SMALLEST, INT_MAX, check_derived, float_error, in_float32,
                                  number_from_text)

__all__ = ["FLOAT32_MAX", "FLOAT32_SMALLEST", "INT_MAX", "check_derived", "float_error", "in_float32", "number_from_text"]
