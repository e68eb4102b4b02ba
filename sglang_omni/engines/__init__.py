"""What a stage process runs: the engine protocol and its backends (native, hf, scripted)."""
