"""Hugging Face causal LMs as strata programs: `strata compile MODEL`, whole model or one layer.

    source.py      a MODEL argument (a bundled name or a local directory) -> its config
    checkpoint.py  safetensors checkpoints: find, check against the config, load
    build.py       the transformers module (meta device, random or loaded weights) + inputs
    wrappers.py    what is captured: the whole model -> logits, or one decoder layer

Nothing is ever downloaded: the bundled configs (configs/*.json) were transcribed from the
models' published config.json files, and weights come only from a local directory.
`transformers` is imported lazily, on the first model built.
"""
