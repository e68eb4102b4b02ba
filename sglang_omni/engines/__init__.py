"""What a stage process runs: the backends (native, hf, scripted) behind the engine interface of
``sglang_omni.contract.job``, and ``base.build_engine``, which builds the one a stage names."""
