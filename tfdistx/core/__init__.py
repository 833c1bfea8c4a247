"""The run spec and the fact tables: plain data and checks, no Hydra, no TensorFlow.

What every side reads: the engine is handed a RunSpec (run_spec.py); the launcher, placement,
`--plan` and the manifests read it and the facts beside it (a strategy's in strategies.py, the
exit codes in errors.py, ...). The Hydra side (tfdistx/config/) composes and resolves the config
into it and is the only side that reads a DictConfig.
"""
