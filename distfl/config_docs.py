"""Old entry point of `distfl.config.docs`: `python -m distfl.config_docs > docs/config.md`."""
from distfl.config.docs import config_reference_markdown, options_comments

__all__ = ["config_reference_markdown", "options_comments"]

if __name__ == "__main__":
    print(config_reference_markdown(), end="")
