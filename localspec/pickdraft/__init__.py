"""pick-draft: which draft (a model, n-gram lookup, layer-skip, or none) pays for a target on this machine.

`rank` plans and ranks candidates from numbers alone; `cost` estimates speed;
`memplan` and `devices` fit models into memory; `machine` adds this machine's
memory and measured curves; `measure` runs the models to measure. Importing this
package loads no llama.cpp.
"""
