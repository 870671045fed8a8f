"""The auto controller: which method and how many tokens to draft at each step, from measured costs.

`costmodel` is the pure arithmetic (cost curves, expected tokens, plans); `policy`
the per-step AutoPolicy the engine runs; `calibrate` measures a machine's curves;
`replay` and `oracle` judge policies on recorded traces.
"""
