"""Hugging Face causal LMs as strata programs: `strata compile MODEL`, whole model or one layer.

    source.py      a MODEL argument (a bundled name, a local directory or a GGUF file) -> its config
    checkpoint.py  safetensors checkpoints: find, check against the config, load
    build.py       the transformers module (meta device, random or loaded weights) + inputs
    wrappers.py    what is captured: the whole model -> logits, or one decoder layer
    gguf_file.py   a llama GGUF file (llama.cpp's format) -> config, checks, QuantLinear layout
    gguf_names.py  llama.cpp's tensor names and q/k row order against transformers'
    gguf_write.py  a Llama model -> GGUF file (F32, F16, Q8_0, Q4_0), for tests and benchmarks

Nothing is ever downloaded: the bundled configs (configs/*.json) were transcribed from the
models' published config.json files, and weights come only from a local directory or file.
`transformers` is imported lazily, on the first model built.
"""
