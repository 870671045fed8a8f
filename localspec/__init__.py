"""localspec: lossless speculative decoding on llama.cpp, as a library, a daemon and a chat TUI.

This module stays import-light on purpose: `scripts/fetch-models` imports
`localspec.fetch` before the virtual environment (and llama.cpp) exists.
"""

__version__ = "0.1.0"
