"""`torch.compile(model, backend="strata")`: dynamo's graphs compiled by strata (backend.py), the
programs dynamo calls (programs.py), its graphs' own tensors and foreach ops rewritten for capture
(rewrite.py), and training graphs split by AOTAutograd (training.py)."""
